"""An exhaustive breadth-first model checker over the lifecycle specs.

It explores every configuration a lifecycle can reach, inserting a crash-and-restart at every
crash point of every durable transition (and between transitions), and checks after each
recovery that:

- no state is stranded: every non-terminal state either is a durable wait, is reclaimed by a
  live owner, or is moved by its recovery edge;
- terminal states never change;
- an approval is consumed at most once;
- a non-idempotent external effect happens at most once (in the execution x tool call
  product, where the tool's idempotency is known);
- every record can still end well (reach a terminal state; for the owed-request ledger,
  answered or reported);
- a finished execution leaves no call of its own in flight (product only).

Guards the checker cannot know (a deadline, a policy) are free: both outcomes are explored.
In the product, guards that follow from the other record (`execution_ended`,
`must_interrupt`, `retry_allowed`) are computed from it. Exploration is breadth-first, so the
first trace found to a violation is a shortest one.

The checker deliberately works on specs that did not pass `spec.load`: a planted broken spec
must be caught here, at run time, not only by the static rules.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from spec.crash_points import phases
from spec.model import (
    Composition,
    EffectTiming,
    MachineSpec,
    Otherwise,
    Phase,
    TransitionKind,
    TransitionSpec,
)

INVARIANTS = (
    "no state is stranded after recovery",
    "terminal states never change",
    "an approval is consumed at most once",
    "every record can still reach a good end",
)
PRODUCT_INVARIANTS = (
    *INVARIANTS,
    "a non-idempotent effect happens at most once",
    "a finished execution leaves no call in flight",
    "a stale owner never moves a call",
    "recovery commits what it decided on the records as they are",
)

#: Guard valuations: name -> truth. Guards absent from a valuation are free.
Valuation = Mapping[str, bool]


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


def _satisfiable(conditions: Sequence[str], unless: Sequence[str], known: Valuation) -> bool:
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
    seen: set[tuple[str | None, bool]] = set()
    for valuation in _valuations(names, known):
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


def _point_name(machine: str, t: TransitionSpec, source: str, phase: Phase) -> str:
    return f"{machine}:{t.event}:{source}->{t.dest}:{phase}"


def _crash_effects(t: TransitionSpec, phase: Phase) -> tuple[bool, bool]:
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


# ---------------------------------------------------------------------------------------------
# The generic explorer: a configuration graph with labelled moves.
# ---------------------------------------------------------------------------------------------

Move = tuple[str, "object"]


class _Explorer:
    """Breadth-first search with parent links, so every violation gets a shortest trace."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self.parent: dict[object, tuple[object, str] | None] = {}
        self.edges: dict[object, list[object]] = {}
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
        successors: Callable[[object], list[tuple[str, object]]],
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
        # Liveness: every configuration can still reach a good end.
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


# ---------------------------------------------------------------------------------------------
# One lifecycle on its own.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Single:
    status: str
    recovering: bool = False
    approvals: int = 0

    def __str__(self) -> str:
        extra = " (recovering)" if self.recovering else ""
        return f"{self.status}{extra}"


def check_machine(spec: MachineSpec) -> Report:
    report = Report(name=spec.name)
    explorer = _Explorer(report)
    terminal = spec.terminal_names
    good_ends = set(spec.good_ends) or set(terminal)

    def fire(config: Single, t: TransitionSpec, label: str) -> Single | None:
        if config.status in terminal:
            explorer.violate(
                "terminal states never change",
                f"{t.event!r} moves the terminal state {config.status!r} to {t.dest!r}",
                config,
                label,
            )
            return None
        approvals = config.approvals + (1 if t.consumes_approval else 0)
        nxt = replace(config, status=t.dest, approvals=min(approvals, 2))
        if approvals > 1:
            explorer.violate(
                "an approval is consumed at most once",
                f"the approval is consumed again by {t.event!r}",
                config,
                label,
            )
        return nxt

    def successors(c: object) -> list[tuple[str, object]]:
        assert isinstance(c, Single)
        moves: list[tuple[str, object]] = []
        if c.recovering:
            for valuation, outcome in recovery_outcomes(spec, c.status, {}):
                guards = ", ".join(f"{k}={v}" for k, v in valuation.items())
                when = f" [{guards}]" if guards else ""
                if outcome.stranded:
                    explorer.violate(
                        "no state is stranded after recovery",
                        f"after a crash, {spec.name} in {c.status!r} has no live owner, is not "
                        f"a durable wait, and no recovery edge moves it{when}",
                        c,
                        f"recovery finds nothing to do for {c.status!r}{when}",
                    )
                elif outcome.settled:
                    moves.append(
                        (
                            f"restart complete: {c.status!r} settled{when}",
                            replace(c, recovering=False),
                        )
                    )
                elif outcome.transition is not None:
                    t = outcome.transition
                    moves.extend(transition_moves(c, t, f"recover: {spec.name}.{t.event}{when}"))
            return moves
        for t in spec.transitions:
            if t.kind is TransitionKind.RECOVERY or c.status not in t.source:
                continue
            if not _satisfiable(t.conditions, t.unless, {}):
                continue
            moves.extend(transition_moves(c, t, f"{spec.name}.{t.event}"))
        if c.status not in terminal:
            moves.append(("crash between transitions, restart", replace(c, recovering=True)))
        return moves

    def transition_moves(c: Single, t: TransitionSpec, label: str) -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = []
        done = fire(c, t, label)
        if done is None:
            return out
        # A recovery transition leaves the record to be looked at again.
        out.append((label, replace(done, recovering=True) if c.recovering else done))
        for phase in phases(t):
            point = _point_name(spec.name, t, c.status, phase)
            report.crash_points_reached.add(point)
            committed, _ = _crash_effects(t, phase)
            after = done if committed else c
            out.append((f"{label}, crash at {point}, restart", replace(after, recovering=True)))
        return out

    explorer.run(
        Single(spec.initial.name),
        successors,
        lambda c: isinstance(c, Single) and c.status in good_ends and not c.recovering,
    )
    return report


# ---------------------------------------------------------------------------------------------
# Execution x tool call.
# ---------------------------------------------------------------------------------------------

NO_CALL = "-"
MAX_CALLS = 2


@dataclass(frozen=True, order=True)
class Pair:
    execution: str
    call: str = NO_CALL
    recovering: bool = False
    approvals: int = 0
    dispatches: int = 0
    calls: int = 0
    idempotent: bool = False
    conservative: bool = False
    #: The call state a stalled owner still believes in, after another instance recovered
    #: its execution ("" when no owner is stale); it acts on its call `stale_calls`.
    stale: str = ""
    stale_calls: int = 0

    def __str__(self) -> str:
        world = f"{'idempotent' if self.idempotent else 'non-idempotent'} tool" + (
            ", conservative" if self.conservative else ""
        )
        rec = ", recovering" if self.recovering else ""
        stale = f", a stale owner believes the call {self.stale}" if self.stale else ""
        return f"(execution {self.execution}, call {self.call}{rec}{stale}; {world})"


def check_composition(comp: Composition, machines: Mapping[str, MachineSpec]) -> Report:
    """The product of an execution and its current tool call (see spec.composition)."""
    ex, tc = (machines[m] for m in comp.machines)
    report = Report(name=comp.name, invariants=PRODUCT_INVARIANTS)
    explorer = _Explorer(report)
    joint_events = {(m, e) for j in comp.joint_steps for (m, e) in j.steps}
    requires = {key: set(states) for key, states in comp.requires}
    fenced = set(comp.fenced)
    recovery_fenced = set(comp.recovery_fenced)
    #: What the owner of a running execution does to its call (the moves a stale one tries).
    owner_moves = [event for (machine, event) in requires if machine == tc.name]

    def settled(call: str) -> bool:
        return call == NO_CALL or call in tc.terminal_names

    def derived(p: Pair) -> dict[str, bool]:
        retry = p.idempotent and not p.conservative
        return {
            "retry_allowed": retry,
            "execution_ended": p.execution in ex.terminal_names,
            "must_interrupt": p.conservative or p.call == "in_doubt",
        }

    def allowed(machine: str, event: str, p: Pair) -> bool:
        other = p.call if machine == ex.name else p.execution
        need = requires.get((machine, event))
        # An execution that has made no call yet is as free as one whose call is settled.
        return need is None or other in need or other == NO_CALL

    def enabled(
        spec: MachineSpec, status: str, event: str, known: Valuation
    ) -> list[TransitionSpec]:
        if status == NO_CALL:
            return []
        return [
            t
            for t in spec.transitions_for(event)
            if status in t.source and _satisfiable(t.conditions, t.unless, known)
        ]

    def apply(p: Pair, changes: Sequence[tuple[str, TransitionSpec]], label: str) -> Pair | None:
        nxt = p
        for machine, t in changes:
            current = nxt.execution if machine == ex.name else nxt.call
            spec = ex if machine == ex.name else tc
            if current in spec.terminal_names:
                explorer.violate(
                    "terminal states never change",
                    f"{machine}.{t.event} moves the terminal state {current!r}",
                    p,
                    label,
                )
                return None
            if machine == ex.name:
                nxt = replace(nxt, execution=t.dest)
            else:
                approvals = nxt.approvals + (1 if t.consumes_approval else 0)
                if approvals > 1:
                    explorer.violate(
                        "an approval is consumed at most once",
                        f"tool_call.{t.event} consumes the same approval again",
                        p,
                        label,
                    )
                nxt = replace(nxt, call=t.dest, approvals=min(approvals, 2))
        return nxt

    def with_effect(p: Pair, t: TransitionSpec, label: str) -> Pair:
        if t.external_effect is None or t.external_effect.name != "call_tool":
            return p
        dispatches = p.dispatches + 1
        if dispatches > 1 and not p.idempotent:
            explorer.violate(
                "a non-idempotent effect happens at most once",
                "the non-idempotent tool is called a second time",
                p,
                label,
            )
        return replace(p, dispatches=min(dispatches, 2))

    def moves_for(
        p: Pair, changes: Sequence[tuple[str, TransitionSpec]], label: str
    ) -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = []
        done = apply(p, changes, label)
        if done is None:
            return out
        effectful = [t for _, t in changes if t.external_effect is not None]
        finished = done
        for t in effectful:
            finished = with_effect(finished, t, label)
        out.append((label, replace(finished, recovering=p.recovering)))
        for machine, t in changes:
            source = p.execution if machine == ex.name else p.call
            for phase in phases(t):
                point = _point_name(machine, t, source, phase)
                report.crash_points_reached.add(point)
                committed, effect_done = _crash_effects(t, phase)
                after = done if committed else p
                if effect_done:
                    after = with_effect(after, t, f"{label}, crash at {point}")
                out.append((f"{label}, crash at {point}, restart", replace(after, recovering=True)))
        return out

    def recovery_moves(p: Pair) -> list[tuple[str, object]]:
        known = derived(p)
        # The journal is recovered before its execution: whether the execution may go on
        # depends on what became of its call.
        for spec, status in ((tc, p.call), (ex, p.execution)):
            if status == NO_CALL:
                continue
            moves: list[tuple[str, object]] = []
            any_transition = False
            for valuation, outcome in recovery_outcomes(spec, status, known):
                when = ", ".join(f"{k}={v}" for k, v in valuation.items() if k not in known)
                when = f" [{when}]" if when else ""
                if outcome.stranded:
                    explorer.violate(
                        "no state is stranded after recovery",
                        f"after a crash, {spec.name} in {status!r} has no live owner, is not a "
                        f"durable wait, and no recovery edge moves it",
                        p,
                        f"recovery finds nothing to do for {spec.name} {status!r}{when}",
                    )
                elif outcome.transition is not None:
                    any_transition = True
                    t = outcome.transition
                    for label, nxt in moves_for(
                        p, [(spec.name, t)], f"recover: {spec.name}.{t.event}{when}"
                    ):
                        assert isinstance(nxt, Pair)
                        moves.append((label, replace(nxt, recovering=True)))
                    if spec is ex:
                        moves.extend(woken_before_commit(p, t, when))
            if any_transition:
                return moves
        return [("restart complete", replace(p, recovering=False))]

    def successors(c: object) -> list[tuple[str, object]]:
        assert isinstance(c, Pair)
        if c.recovering:
            return recovery_moves(c)
        if c.execution in ex.terminal_names and not settled(c.call):
            explorer.violate(
                "a finished execution leaves no call in flight",
                f"execution {c.execution!r} while its call is {c.call!r}",
                c,
                None,
            )
        moves: list[tuple[str, object]] = []
        known: dict[str, bool] = {k: v for k, v in derived(c).items() if k != "must_interrupt"}
        # A new call: a new journal row, made by the running execution.
        if c.execution == "running" and settled(c.call) and c.calls < MAX_CALLS:
            moves.append(
                (
                    "execution calls a tool (new journal row)",
                    replace(c, call=tc.initial.name, calls=c.calls + 1, approvals=0, dispatches=0),
                )
            )
        for spec, status in ((ex, c.execution), (tc, c.call)):
            for event in spec.events():
                if (spec.name, event) in joint_events and (spec.name, event) not in requires:
                    continue
                if not allowed(spec.name, event, c):
                    continue
                for t in enabled(spec, status, event, known):
                    if t.kind is TransitionKind.RECOVERY:
                        continue
                    moves.extend(moves_for(c, [(spec.name, t)], f"{spec.name}.{t.event}"))
        for joint in comp.joint_steps:
            picks: list[tuple[str, TransitionSpec]] = []
            for machine, event in joint.steps:
                spec = ex if machine == ex.name else tc
                status = c.execution if machine == ex.name else c.call
                options = enabled(spec, status, event, known)
                if not options:
                    break
                picks.append((machine, options[0]))
            else:
                conds = [g for _, t in picks for g in t.conditions]
                unless = [g for _, t in picks for g in t.unless]
                if _satisfiable(conds, unless, known):
                    moves.extend(moves_for(c, picks, f"joint {joint.name}"))
        if c.execution not in ex.terminal_names or not settled(c.call):
            moves.append(("crash between transitions, restart", replace(c, recovering=True)))
        moves.extend(stale_owner_moves(c))
        return moves

    def stale_owner_moves(c: Pair) -> list[tuple[str, object]]:
        """An owner stalls with a call in flight (its process paused, not dead); its lease
        lapses and another instance recovers the execution. Later it wakes and tries its
        next move on the call with what it read before: its write matches the call's row
        (nothing else moved the call), so only the execution's fence can refuse it."""
        if not c.stale:
            if c.execution in ex.terminal_names or settled(c.call):
                return []
            stalled = replace(c, recovering=True, stale=c.call, stale_calls=c.calls)
            return [("the owner stalls; its lease lapses; another instance recovers", stalled)]
        if c.call != c.stale or c.calls != c.stale_calls:
            return []  # the call moved since: the stale owner's write conflicts
        for event in owner_moves:
            if (tc.name, event) in fenced:
                continue  # the execution moved (recovery): the fence refuses the write
            for t in tc.transitions_for(event):
                if c.stale in t.source and t.kind is not TransitionKind.RECOVERY:
                    explorer.violate(
                        "a stale owner never moves a call",
                        f"tool_call.{event} ({c.stale} -> {t.dest}) is committed by an "
                        "instance whose execution was recovered by another: it is not fenced",
                        c,
                        f"the stale owner wakes and tries tool_call.{event}",
                    )
        return []

    def woken_before_commit(p: Pair, t: TransitionSpec, when: str) -> list[tuple[str, object]]:
        """Recovery has read the call and decided the execution's edge `t`; before it
        commits, the stalled owner wakes and moves the call (the execution has not moved
        yet, so the owner's fence on it still passes). A commit fenced on the call conflicts
        and recovery reads again; an unfenced one lands a decision made on a call that is
        no longer there, which is a violation when the spec would decide otherwise now."""
        if not p.stale or p.call != p.stale or p.calls != p.stale_calls or settled(p.call):
            return []
        out: list[tuple[str, object]] = []
        known = {k: v for k, v in derived(p).items() if k != "must_interrupt"}
        for event in owner_moves:
            for moved in enabled(tc, p.call, event, known):
                if moved.kind is TransitionKind.RECOVERY:
                    continue
                woke = f"the stale owner wakes before recovery commits and tries tool_call.{event}"
                after = apply(p, [(tc.name, moved)], woke)
                if after is None:
                    continue
                if moved.external_effect is not None:
                    after = with_effect(after, moved, woke)
                if (ex.name, t.event) in recovery_fenced:
                    out.append(
                        (
                            f"{woke}; recovery's execution.{t.event}{when} is fenced on the "
                            "call and conflicts: recovery reads again",
                            replace(after, recovering=True, stale=after.call),
                        )
                    )
                    continue
                now_chosen = [
                    o.transition.event
                    for _, o in recovery_outcomes(tc, after.call, derived(after))
                    if o.transition is not None
                ]
                if now_chosen:
                    explorer.violate(
                        "recovery commits what it decided on the records as they are",
                        f"recovery commits execution.{t.event}, decided on the call as "
                        f"{p.call!r}, after the stale owner moved it to {after.call!r}, where "
                        f"the spec recovers the call first ({', '.join(now_chosen)}): the "
                        "commit is not fenced on the call it read",
                        p,
                        woke,
                    )
        return out

    def good_end(c: object) -> bool:
        return isinstance(c, Pair) and not c.recovering and c.execution in ex.terminal_names

    for idempotent, conservative in itertools.product((False, True), repeat=2):
        explorer.run(
            Pair(ex.initial.name, idempotent=idempotent, conservative=conservative),
            successors,
            good_end,
        )
    report.states = len(explorer.parent)
    return report


def check_all(
    machines: Mapping[str, MachineSpec], compositions: Mapping[str, Composition]
) -> list[Report]:
    reports = [check_machine(spec) for spec in machines.values()]
    reports.extend(check_composition(c, machines) for c in compositions.values())
    return reports
