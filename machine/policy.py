"""Which tool calls run at once, which wait for a person, and which never run.

A policy is a list of rules keyed by a pattern over tool full names (`source.name`, or
`principal:source.name` for a source a principal added). Among the
rules that match a tool the most restrictive wins, so adding a rule can only tighten what an
operator already wrote for a narrower pattern, never silently loosen it. A tool no rule
matches keeps its own `default_policy`.

A rule may carry a condition on what the call does: an HTTP method (`DELETE`) or a GraphQL
operation type (`mutation`), matched against the tool's `operation`, so `github.*[DELETE]`
blocks every delete of a source without naming its tools. Rules come from the operator's
`LOCKGATE_POLICY` and from the database (global ones and each principal's: `PolicyBook`);
all that match one principal's call are weighed together.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import StrEnum
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, field_validator

from lockgate.machine.errors import ErrorCode, LockgateError

if TYPE_CHECKING:  # the registry imports PolicyDecision from here; avoid the cycle at runtime
    from lockgate.machine.tools.registry import ToolSpec


class PolicyDecision(StrEnum):
    APPROVE = "approve"
    REQUIRE_APPROVAL = "require_approval"
    BLOCK = "block"


# Higher is more restrictive; `decide` takes the maximum over matching rules.
_RESTRICTIVENESS = {
    PolicyDecision.APPROVE: 0,
    PolicyDecision.REQUIRE_APPROVAL: 1,
    PolicyDecision.BLOCK: 2,
}

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
#: A principal's name, as the owner of a source it added (`server/keys.py`).
_OWNER = r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}:"
_PATTERN_RE = re.compile(rf"\*|(?:{_OWNER})?{_IDENT}\.\*|(?:{_OWNER})?{_IDENT}\.{_IDENT}")
PATTERN_FORMS = (
    "'*', 'source.*' or 'source.name' (without the 'tools.' prefix), or for a source a "
    "principal added, 'principal:source.*' or 'principal:source.name'"
)

#: What a rule's condition may name: a tool's `operation` (see `ToolSpec.operation`).
HTTP_METHODS = ("GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE")
GRAPHQL_OPERATIONS = ("query", "mutation", "subscription")
CONDITION_FORMS = (
    f"an HTTP method ({', '.join(HTTP_METHODS)}) or a GraphQL operation type "
    f"({', '.join(GRAPHQL_OPERATIONS)})"
)


#: How a tool listing says what the policy does with a call, in words an agent reads.
DECISION_WORDS = {
    PolicyDecision.APPROVE: "auto-approved",
    PolicyDecision.REQUIRE_APPROVAL: "requires approval",
    PolicyDecision.BLOCK: "blocked by policy",
}


def most_restrictive(decisions: Iterable[PolicyDecision]) -> PolicyDecision | None:
    """The strictest of `decisions`, or None when there are none."""
    return max(decisions, key=_RESTRICTIVENESS.__getitem__, default=None)


class InvalidPolicy(LockgateError):
    """A policy rule or policy text that cannot be understood."""

    code = ErrorCode.INVALID_INPUT

    def __init__(self, message: str) -> None:
        super().__init__(
            message,
            hint=f"Write rules as pattern=decision separated by commas, with patterns "
            f"{PATTERN_FORMS}, an optional [condition] after the pattern naming "
            f"{CONDITION_FORMS}, and decisions {_decision_names()}; for example "
            "'notes.*=approve,notes.delete=block,github.*[DELETE]=block'.",
        )


class ToolBlocked(LockgateError):
    """The policy forbids this tool: the call is refused before anything is dispatched."""

    code = ErrorCode.BLOCKED

    def __init__(self, *, tool: str) -> None:
        self.tool = tool
        super().__init__(
            f"tools.{tool} is blocked by policy and was not called",
            hint="Use another tool, or ask an operator to change the tool policy.",
        )


def _decision_names() -> str:
    return ", ".join(d.value for d in PolicyDecision)


def _split_condition(target: str) -> tuple[str, str | None]:
    """`github.*[DELETE]` -> ('github.*', 'DELETE'); no brackets -> (target, None)."""
    if target.endswith("]") and "[" in target:
        pattern, _, condition = target[:-1].partition("[")
        return pattern.strip(), condition.strip()
    return target, None


#: The longest pattern a stored rule keeps (a source and a tool name, each an identifier).
MAX_PATTERN_CHARS = 300


def _pattern_problem(pattern: str) -> str | None:
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"pattern {pattern[:60]!r}… is longer than {MAX_PATTERN_CHARS} characters"
    if _PATTERN_RE.fullmatch(pattern):
        return None
    if pattern.startswith("tools."):
        return f"pattern {pattern!r} must not start with 'tools.'"
    return f"pattern {pattern!r} is not one of {PATTERN_FORMS}"


def normal_condition(condition: str) -> str:
    """The condition as rules store it (methods upper case, operation types lower case), or
    ValueError saying what a condition may be."""
    if condition.upper() in HTTP_METHODS:
        return condition.upper()
    if condition.lower() in GRAPHQL_OPERATIONS:
        return condition.lower()
    raise ValueError(f"condition {condition!r} is not {CONDITION_FORMS}")


class PolicyRule(BaseModel):
    model_config = ConfigDict(frozen=True)

    pattern: str
    decision: PolicyDecision
    #: Only calls whose tool makes this operation (HTTP method or GraphQL operation type).
    condition: str | None = None

    @field_validator("condition")
    @classmethod
    def _check_condition(cls, condition: str | None) -> str | None:
        return None if condition is None else normal_condition(condition)

    @field_validator("pattern")
    @classmethod
    def _check_pattern(cls, pattern: str) -> str:
        problem = _pattern_problem(pattern)
        if problem:
            raise ValueError(problem)
        return pattern

    def matches(self, spec: ToolSpec) -> bool:
        if self.condition is not None and spec.operation != self.condition:
            return False
        if self.pattern == "*":
            return True
        if self.pattern.endswith(".*"):
            return spec.policy_name.startswith(self.pattern[:-1])
        return spec.policy_name == self.pattern

    @property
    def target(self) -> str:
        """The pattern with its condition: `github.*[DELETE]`."""
        return self.pattern + (f"[{self.condition}]" if self.condition else "")

    def __str__(self) -> str:
        return f"{self.target}={self.decision.value}"


class Policy:
    """An ordered set of rules; rule order never changes a decision."""

    def __init__(self, rules: Iterable[PolicyRule] = ()) -> None:
        self.rules: tuple[PolicyRule, ...] = tuple(rules)

    @classmethod
    def from_text(cls, text: str) -> Policy:
        """Parse `pattern=decision` entries separated by commas or newlines.

        Blank entries are ignored, so a trailing comma or an empty variable is fine. The same
        pattern given twice is refused: one of the two was almost certainly a mistake.
        """
        rules: list[PolicyRule] = []
        seen: dict[str, str] = {}
        for raw in re.split(r"[,\n]", text):
            entry = raw.strip()
            if not entry:
                continue
            target, sep, decision = (part.strip() for part in entry.partition("="))
            if not sep:
                raise InvalidPolicy(
                    f"policy entry {entry!r} has no '=' (expected pattern=decision)"
                )
            pattern, condition = _split_condition(target)
            try:
                condition = None if condition is None else normal_condition(condition)
            except ValueError as exc:
                raise InvalidPolicy(f"policy entry {entry!r}: {exc}") from None
            problem = _pattern_problem(pattern)
            if problem:
                raise InvalidPolicy(f"policy entry {entry!r}: {problem}")
            try:
                parsed = PolicyDecision(decision.lower())
            except ValueError:
                raise InvalidPolicy(
                    f"policy entry {entry!r}: unknown decision {decision!r} "
                    f"(expected one of {_decision_names()})"
                ) from None
            rule = PolicyRule(pattern=pattern, decision=parsed, condition=condition)
            if rule.target in seen:
                raise InvalidPolicy(
                    f"policy entry {entry!r}: pattern {rule.target!r} is already given as "
                    f"{seen[rule.target]!r}"
                )
            seen[rule.target] = entry
            rules.append(rule)
        return cls(rules)

    def to_text(self) -> str:
        return ",".join(str(rule) for rule in self.rules)

    def matching(self, spec: ToolSpec) -> list[PolicyRule]:
        return [rule for rule in self.rules if rule.matches(spec)]

    def decide(self, spec: ToolSpec, principal: str | None = None) -> PolicyDecision:
        """The decision for a call of `spec` (the same for every principal: these rules are
        the operator's; `PolicyBook` adds each principal's)."""
        decision = most_restrictive(rule.decision for rule in self.matching(spec))
        return spec.default_policy if decision is None else decision

    def __add__(self, other: Policy) -> Policy:
        return Policy(self.rules + other.rules)

    def __repr__(self) -> str:
        return f"Policy({self.to_text()!r})"
