"""What every model check shares: violations and reports, guard valuations, what recovery
does to one record, what a crash leaves behind, and the breadth-first explorer.

The single-lifecycle check (`spec.lifecycle_check`) and the execution x tool call product
(`spec.product_check`) differ only in their configurations and moves; both are built from
these pieces so that they count states, name crash points and report violations alike.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from lockgate.spec.crash_points import phases
from lockgate.spec.model import EffectTiming, MachineSpec, Otherwise, Phase, TransitionSpec

INVARIANTS = (
    "no state is stranded after recovery",
    "terminal states never change",
    "an approval is consumed at most once",
    "every record can still reach a good end",
)

#: Guard valuations: name -> truth. Guards absent from a valuation are free.
Valuation = Mapping[str, bool]

#: A labelled edge of the configuration graph: what happened, and the configuration after it.
Move = tuple[str, object]


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str
    trace: tuple[str, ...]

    def render(self) -> str:
        steps = "\n".join(f"    {i + 1}. {s}" for i, s in enumerate(self.trace))
        return f"  VIOLATION [{self.invariant}] {self.detail}\n  shortest trace:\n{steps}"


@dataclass
class Report:
    name: str
    states: int = 0
    transitions: int = 0
    crash_points_reached: set[str] = field(default_factory=set)
    invariants: tuple[str, ...] = INVARIANTS
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def render(self) -> str:
        head = (
            f"{self.name}: {self.states} states, {self.transitions} transitions explored, "
            f"{len(self.crash_points_reached)} crash points, {len(self.invariants)} invariants"
            f" checked: {'ok' if self.ok else f'{len(self.violations)} violation(s)'}"
        )
        return "\n".join([head, *(v.render() for v in self.violations)])


def satisfiable(conditions: Sequence[str], unless: Sequence[str], known: Valuation) -> bool:
    """Whether some valuation of the free guards lets a transition with these guards fire."""
    if set(conditions) & set(unless):
        return False
    return all(known.get(g, True) for g in conditions) and not any(
        known.get(g, False) for g in unless
    )


def _holds(t: TransitionSpec, valuation: Valuation) -> bool:
    return all(valuation[g] for g in t.conditions) and not any(valuation[g] for g in t.unless)


def _valuations(names: Sequence[str], known: Valuation) -> Iterator[dict[str, bool]]:
    free = sorted({n for n in names if n not in known})
    for values in itertools.product((False, True), repeat=len(free)):
        yield {**known, **dict(zip(free, values, strict=True))}


def guard_note(valuation: Valuation, known: Valuation) -> str:
    """The free guards a move was taken under, for its label: " [g=True, h=False]", or ""
    when every guard was known (a known guard says nothing about the choice made)."""
    free = ", ".join(f"{k}={v}" for k, v in valuation.items() if k not in known)
    return f" [{free}]" if free else ""


@dataclass(frozen=True)
class RecoveryOutcome:
    """What recovery does to one record: fire `transition`, or settle (`settled`), or
    nothing can move a state that needs moving (`stranded`)."""

    transition: TransitionSpec | None = None
    settled: bool = False
    stranded: bool = False


def recovery_outcomes(
    spec: MachineSpec, status: str, known: Valuation
) -> list[tuple[Valuation, RecoveryOutcome]]:
    """Every distinct outcome recovery can have for a record in `status`."""
    state = spec.state(status)
    if state.terminal:
        return [({}, RecoveryOutcome(settled=True))]
    on_crash = state.on_crash
    if on_crash is None:
        return [({}, RecoveryOutcome(stranded=True))]
    candidates = [
        t for event in on_crash.events for t in spec.transitions_for(event) if status in t.source
    ]
    names = [g for t in candidates for g in t.guard_names()]
    out: list[tuple[Valuation, RecoveryOutcome]] = []
    # Many valuations lead to the same outcome; one witness of each keeps the graph small.
    seen: set[tuple[str | None, bool]] = set()
    for valuation in _valuations(names, known):
        # Recovery tries its events in the declared order and fires the first that holds.
        fired = next((t for t in candidates if _holds(t, valuation)), None)
        if fired is not None:
            outcome = RecoveryOutcome(transition=fired)
        elif on_crash.otherwise in (Otherwise.DURABLE_WAIT, Otherwise.RECLAIM):
            outcome = RecoveryOutcome(settled=True)
        else:
            outcome = RecoveryOutcome(stranded=True)
        key = (fired.event if fired else None, outcome.stranded)
        if key not in seen:
            seen.add(key)
            out.append(({k: valuation[k] for k in sorted(set(names))}, outcome))
    return out


def point_name(machine: str, t: TransitionSpec, source: str, phase: Phase) -> str:
    """The crash point's name, as `spec.crash_points` and the simulator spell it."""
    return f"{machine}:{t.event}:{source}->{t.dest}:{phase}"


def crash_effects(t: TransitionSpec, phase: Phase) -> tuple[bool, bool]:
    """(committed, effect_done) at the moment of a crash in `phase` of `t`."""
    order = phases(t)
    passed = order[: order.index(phase) + 1]
    committed = "after_commit" in passed
    has_effect = t.external_effect is not None
    if not has_effect:
        return committed, False
    if t.external_effect is not None and t.external_effect.timing is EffectTiming.BEFORE_COMMIT:
        return committed, True  # the effect runs before any of its crash points
    return committed, "after_effect" in passed


class Explorer:
    """Breadth-first search with parent links, so every violation gets a shortest trace."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self.parent: dict[object, tuple[object, str] | None] = {}
        self.edges: dict[object, list[object]] = {}
        # One violation per (invariant, detail): the first, and so the shortest, trace wins.
        self.found: set[tuple[str, str]] = set()

    def trace(self, config: object, last: str | None = None) -> tuple[str, ...]:
        steps: list[str] = [] if last is None else [last]
        node: object = config
        while (link := self.parent[node]) is not None:
            node, label = link
            steps.append(label)
        return tuple(reversed(steps))

    def violate(self, invariant: str, detail: str, config: object, last: str | None) -> None:
        key = (invariant, detail)
        if key not in self.found:
            self.found.add(key)
            self.report.violations.append(Violation(invariant, detail, self.trace(config, last)))

    def run(
        self,
        initial: object,
        successors: Callable[[object], list[Move]],
        good_end: Callable[[object], bool],
    ) -> None:
        self.parent[initial] = None
        queue = deque([initial])
        while queue:
            config = queue.popleft()
            moves = successors(config)
            self.edges[config] = [nxt for _, nxt in moves]
            for label, nxt in moves:
                self.report.transitions += 1
                if nxt not in self.parent:
                    self.parent[nxt] = (config, label)
                    queue.append(nxt)
        self.report.states = len(self.parent)
        # Liveness: every configuration can still reach a good end. Walking back from the good
        # ends over reversed edges finds all that can, in one pass.
        backwards: dict[object, list[object]] = {c: [] for c in self.parent}
        for src, dests in self.edges.items():
            for d in dests:
                backwards[d].append(src)
        good = {c for c in self.parent if good_end(c)}
        queue = deque(good)
        while queue:
            for prev in backwards[queue.popleft()]:
                if prev not in good:
                    good.add(prev)
                    queue.append(prev)
        # Insertion order is BFS order, so the first hit is the nearest; a settled
        # configuration says more than one caught mid-recovery, so it is preferred.
        doomed = [c for c in self.parent if c not in good]
        doomed.sort(key=lambda c: bool(getattr(c, "recovering", False)))
        for config in doomed[:1]:
            if config not in good:
                self.violate(
                    "every record can still reach a good end",
                    f"from {config} no sequence of events reaches a good end",
                    config,
                    None,
                )
                break
