"""The operator's stored tool-policy rules (`lockgate policy add|list|remove`): checked
before they are stored, listed with the decision each principal's calls meet."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import ValidationError

from lockgate.machine.db.schema import PolicyRuleRow
from lockgate.machine.db.store import SqlStore
from lockgate.machine.errors import ErrorCode, LockgateError
from lockgate.machine.policy import InvalidPolicy, Policy, PolicyDecision, PolicyRule
from lockgate.machine.policy_book import rule_of, with_stored
from lockgate.machine.tools.registry import ToolRegistry
from lockgate.server.keys import check_principal


class RuleNotFound(LockgateError):
    code = ErrorCode.NOT_FOUND


@dataclass(frozen=True)
class StoredRule:
    id: str
    #: None: the rule applies to every principal.
    principal_id: str | None
    rule: PolicyRule
    #: False when an identical rule was already stored (the existing one is returned).
    added: bool = True


def _stored(row: PolicyRuleRow, added: bool = True) -> StoredRule:
    return StoredRule(row.id, row.principal_id, rule_of(row), added)


class PolicyRules:
    def __init__(self, store: SqlStore, configured: Policy | None = None) -> None:
        self.store = store
        #: The operator's `LOCKGATE_POLICY`, weighed with the stored rules in `effective`.
        self.configured = configured or Policy()

    def add(
        self,
        pattern: str,
        decision: str,
        *,
        condition: str | None = None,
        principal: str | None = None,
    ) -> StoredRule:
        """Store a rule (global unless `principal`); InvalidPolicy says what is wrong."""
        if principal is not None:
            check_principal(principal)
        try:
            rule = PolicyRule(
                pattern=pattern, decision=PolicyDecision(decision.lower()), condition=condition
            )
        except ValueError as exc:  # pydantic's ValidationError is one
            raise InvalidPolicy(f"the rule {pattern}={decision} is refused: {_why(exc)}") from None
        row = PolicyRuleRow(
            id=uuid.uuid4().hex[:12],
            principal_id=principal,
            pattern=rule.pattern,
            condition=rule.condition,
            decision=rule.decision.value,
            created_at=datetime.now(UTC),
        )
        stored = self.store.policies.add(row)
        return _stored(stored, added=stored is row)

    def listed(self, principal: str | None = None) -> list[StoredRule]:
        """Every stored rule, or those that apply to `principal` (the global ones too)."""
        rows = (
            self.store.policies.all()
            if principal is None
            else self.store.policies.applying_to(principal)
        )
        return [_stored(row) for row in rows]

    def remove(self, rule_id: str) -> StoredRule:
        row = self.store.policies.remove(rule_id)
        if row is None:
            raise RuleNotFound(
                f"no stored policy rule has id {rule_id!r}",
                hint="`lockgate policy list` shows the ids.",
            )
        return _stored(row)

    def effective(
        self, registry: ToolRegistry, principal: str | None
    ) -> list[tuple[str, PolicyDecision]]:
        """Each tool's call name with the decision a call by `principal` meets (for no
        principal: the configured and global rules only)."""
        policy = with_stored(self.configured, self.store.policies.applying_to(principal))
        return [(spec.call_name, policy.decide(spec)) for spec in registry.describe("")]


def _why(exc: ValueError) -> str:
    if isinstance(exc, ValidationError):
        # "Value error, pattern ... is not ..." -> the validator's own words.
        return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
    return f"unknown decision (expected one of {', '.join(d.value for d in PolicyDecision)})"
