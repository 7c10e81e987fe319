"""Static rules a lifecycle must satisfy before anything may use it.

Every rule reports a `SpecViolation` naming the machine, the state or transition it is about
and the rule, so a bad spec is refused with a message that says where to look. `check`
collects every violation rather than stopping at the first, because fixing a spec is easier
when the whole list is in front of you.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from lockgate.spec.model import EffectTiming, MachineSpec, TransitionKind, TransitionSpec


class Rule(StrEnum):
    MALFORMED = "malformed"
    UNREACHABLE = "unreachable_state"
    NO_PATH_TO_TERMINAL = "no_path_to_terminal"
    EDGE_FROM_TERMINAL = "edge_from_terminal"
    NO_RECOVERY_EDGE = "no_recovery_edge"
    BAD_RECOVERY_EDGE = "bad_recovery_edge"
    UNBOUND_NAME = "unbound_guard_or_effect"
    AMBIGUOUS = "ambiguous_transition"


@dataclass(frozen=True)
class SpecViolation:
    machine: str
    subject: str
    rule: Rule
    detail: str

    def __str__(self) -> str:
        return f"{self.machine}: {self.subject}: [{self.rule}] {self.detail}"


class SpecInvalid(Exception):
    """A lifecycle spec broke one or more rules; `violations` lists every one."""

    def __init__(self, violations: Iterable[SpecViolation]) -> None:
        self.violations = tuple(violations)
        lines = "\n".join(f"  - {v}" for v in self.violations)
        super().__init__(f"the lifecycle spec is invalid:\n{lines}")


@dataclass(frozen=True)
class Bindings:
    """The guard and effect names the machine layer implements for one machine."""

    guards: frozenset[str]
    effects: frozenset[str]


#: Reports one violation: (subject, rule, detail).
_Report = Callable[[str, "Rule", str], None]


def describe(t: TransitionSpec) -> str:
    return f"transition {t.event!r} ({', '.join(t.source)} -> {t.dest})"


def check(spec: MachineSpec, bindings: Bindings | None = None) -> list[SpecViolation]:
    """Every violation of every rule, in a stable order (empty when the spec is sound)."""
    found: list[SpecViolation] = []

    def violation(subject: str, rule: Rule, detail: str) -> None:
        found.append(SpecViolation(spec.name, subject, rule, detail))

    names = [s.name for s in spec.states]
    declared = set(names)
    for dup in sorted({n for n in names if names.count(n) > 1}):
        violation(f"state {dup!r}", Rule.MALFORMED, "declared more than once")
    initials = [s.name for s in spec.states if s.initial]
    if len(initials) != 1:
        violation("states", Rule.MALFORMED, f"needs exactly one initial state, has {initials}")
    enum_values = {m.value for m in spec.status}
    if enum_values != declared:
        violation(
            f"enum {spec.status.__name__}",
            Rule.MALFORMED,
            f"values {sorted(enum_values)} differ from the declared states {sorted(declared)}",
        )
    for t in spec.transitions:
        for name in (*t.source, t.dest):
            if name not in declared:
                violation(describe(t), Rule.MALFORMED, f"names the undeclared state {name!r}")
        if t.external_effect is not None and not t.durable:
            violation(describe(t), Rule.MALFORMED, "an external effect needs a durable write")
        intent_first = (
            t.external_effect is not None and t.external_effect.timing is EffectTiming.AFTER_COMMIT
        )
        if not t.waits_for_disk and (intent_first or t.consumes_approval):
            violation(
                describe(t),
                Rule.MALFORMED,
                "an intent written before its effect, or a person's decision, must wait for "
                "the disk: lost with the machine, the effect could happen twice or the "
                "decision be asked again",
            )
    if found:
        return found  # the graph rules below assume a well-formed machine

    _check_graph(spec, violation)
    _check_recovery(spec, violation)
    _check_ambiguity(spec, violation)
    if bindings is not None:
        _check_bindings(spec, bindings, violation)
    return found


def _successors(spec: MachineSpec) -> Mapping[str, set[str]]:
    graph: defaultdict[str, set[str]] = defaultdict(set)
    for t in spec.transitions:
        for source, dest in t.edges():
            graph[source].add(dest)
    return graph


def _reachable(graph: Mapping[str, set[str]], start: Iterable[str]) -> set[str]:
    seen = set(start)
    queue = deque(seen)
    while queue:
        for nxt in graph.get(queue.popleft(), ()):
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def _check_graph(spec: MachineSpec, violation: _Report) -> None:
    graph = _successors(spec)
    reachable = _reachable(graph, [spec.initial.name])
    backwards: defaultdict[str, set[str]] = defaultdict(set)
    for source, dests in graph.items():
        for dest in dests:
            backwards[dest].add(source)
    reaches_terminal = _reachable(backwards, spec.terminal_names)
    for state in spec.states:
        if state.name not in reachable:
            violation(
                f"state {state.name!r}",
                Rule.UNREACHABLE,
                f"no sequence of transitions leads to it from {spec.initial.name!r}",
            )
        if not state.terminal and state.name not in reaches_terminal:
            violation(
                f"state {state.name!r}",
                Rule.NO_PATH_TO_TERMINAL,
                "no sequence of transitions leads from it to a terminal state",
            )
    for t in spec.transitions:
        for source in t.source:
            if source in spec.terminal_names:
                violation(
                    describe(t),
                    Rule.EDGE_FROM_TERMINAL,
                    f"leaves the terminal state {source!r}; terminal states never change",
                )


def _check_recovery(spec: MachineSpec, violation: _Report) -> None:
    by_event: defaultdict[str, list[TransitionSpec]] = defaultdict(list)
    for t in spec.transitions:
        by_event[t.event].append(t)
    referenced: set[tuple[str, str]] = set()
    for state in spec.states:
        if state.terminal:
            continue
        if state.on_crash is None:
            violation(
                f"state {state.name!r}",
                Rule.NO_RECOVERY_EDGE,
                "a non-terminal state must say what a crash does to it (on_crash)",
            )
            continue
        for event in state.on_crash.events:
            candidates = [t for t in by_event.get(event, []) if state.name in t.source]
            if not candidates:
                violation(
                    f"state {state.name!r}",
                    Rule.BAD_RECOVERY_EDGE,
                    f"its on_crash names {event!r}, which has no transition from this state",
                )
            for t in candidates:
                referenced.add((t.event, state.name))
                if t.kind is not TransitionKind.RECOVERY:
                    violation(
                        describe(t),
                        Rule.BAD_RECOVERY_EDGE,
                        "is used as a recovery edge but is not declared kind=recovery",
                    )
    for t in spec.transitions:
        if t.kind is not TransitionKind.RECOVERY:
            continue
        for source in t.source:
            if (t.event, source) not in referenced:
                violation(
                    describe(t),
                    Rule.BAD_RECOVERY_EDGE,
                    f"is a recovery transition, but the on_crash of {source!r} never uses it",
                )


def _exclusive(a: TransitionSpec, b: TransitionSpec) -> bool:
    """True when no guard valuation lets both fire: one requires what the other forbids."""
    return bool(set(a.conditions) & set(b.unless) or set(a.unless) & set(b.conditions))


def _check_ambiguity(spec: MachineSpec, violation: _Report) -> None:
    ts = spec.transitions
    for i, a in enumerate(ts):
        for b in ts[i + 1 :]:
            if a.event != b.event:
                continue
            for source in sorted(set(a.source) & set(b.source)):
                if a.dest == b.dest:
                    violation(
                        describe(b),
                        Rule.AMBIGUOUS,
                        f"declares the edge {source!r} -> {b.dest!r} for {b.event!r} twice",
                    )
                elif not _exclusive(a, b):
                    violation(
                        f"event {a.event!r} from {source!r}",
                        Rule.AMBIGUOUS,
                        f"leads to both {a.dest!r} and {b.dest!r}; give one a condition the "
                        "other has in `unless`",
                    )


def _check_bindings(spec: MachineSpec, bindings: Bindings, violation: _Report) -> None:
    for t in spec.transitions:
        for guard in t.guard_names():
            if guard not in bindings.guards:
                violation(describe(t), Rule.UNBOUND_NAME, f"guard {guard!r} is not bound")
        for effect in t.effects:
            if effect not in bindings.effects:
                violation(describe(t), Rule.UNBOUND_NAME, f"effect {effect!r} is not bound")
