"""The model check of an execution and its current tool call, run together.

The product explores what neither lifecycle shows alone: guards that follow from the other
record (`execution_ended`, `must_interrupt`, `retry_allowed`), steps that move both at once
(`spec.composition`), the tool's idempotency (so a second dispatch of a non-idempotent tool
is caught), and two races between instances. A stalled owner whose execution was recovered
by another instance may wake and move its call (`stale_owner_moves`: only the execution's
fence can refuse it), and it may wake in the window after recovery read the call and before
it committed (`woken_before_commit`: only a fence on the call can refuse that commit).
Every combination of idempotent or not and conservative recovery or not is explored.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from lockgate.spec.crash_points import phases
from lockgate.spec.exploration import (
    INVARIANTS,
    Explorer,
    Move,
    Report,
    Valuation,
    crash_effects,
    guard_note,
    point_name,
    recovery_outcomes,
    satisfiable,
)
from lockgate.spec.model import Composition, MachineSpec, TransitionKind, TransitionSpec

PRODUCT_INVARIANTS = (
    *INVARIANTS,
    "a non-idempotent effect happens at most once",
    "a finished execution leaves no call in flight",
    "a stale owner never moves a call",
    "recovery commits what it decided on the records as they are",
)

#: The call column of an execution that has not called a tool yet.
NO_CALL = "-"
#: Calls per execution, bounded so the graph is finite; two are enough for a new call to
#: follow a settled one (and for a stale owner's call to be told from its successor).
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
    explorer = Explorer(report)
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
            if status in t.source and satisfiable(t.conditions, t.unless, known)
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
                # A dispatch that ended in a question made no effect (the tool asks first).
                dispatches = 0 if t.effect_not_made else nxt.dispatches
                nxt = replace(nxt, call=t.dest, approvals=min(approvals, 2), dispatches=dispatches)
        return nxt

    def with_effect(p: Pair, t: TransitionSpec, label: str) -> Pair:
        # Every external effect of a call's lifecycle calls its tool (intent first, or at
        # once for a call that may be made again).
        if t.external_effect is None or t not in tc.transitions:
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

    def moves_for(p: Pair, changes: Sequence[tuple[str, TransitionSpec]], label: str) -> list[Move]:
        out: list[Move] = []
        done = apply(p, changes, label)
        if done is None:
            return out
        effectful = [t for _, t in changes if t.external_effect is not None]
        finished = done
        for t in effectful:
            finished = with_effect(finished, t, label)
        out.append((label, replace(finished, recovering=p.recovering)))
        sources = {ex.name: p.execution, tc.name: p.call}
        for machine, t in changes:
            # A record that takes several steps in one commit leaves each from where the
            # step before left it.
            source = sources[machine]
            sources[machine] = t.dest
            for phase in phases(t):
                point = point_name(machine, t, source, phase)
                report.crash_points_reached.add(point)
                committed, effect_done = crash_effects(t, phase)
                after = done if committed else p
                if effect_done:
                    after = with_effect(after, t, f"{label}, crash at {point}")
                out.append((f"{label}, crash at {point}, restart", replace(after, recovering=True)))
        return out

    def recovery_moves(p: Pair) -> list[Move]:
        known = derived(p)
        # The journal is recovered before its execution: whether the execution may go on
        # depends on what became of its call.
        for spec, status in ((tc, p.call), (ex, p.execution)):
            if status == NO_CALL:
                continue
            moves: list[Move] = []
            any_transition = False
            for valuation, outcome in recovery_outcomes(spec, status, known):
                when = guard_note(valuation, known)
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

    def successors(c: object) -> list[Move]:
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
        moves: list[Move] = []
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
            statuses = {ex.name: c.execution, tc.name: c.call}
            for machine, event in joint.steps:
                spec = ex if machine == ex.name else tc
                options = enabled(spec, statuses[machine], event, known)
                if not options:
                    break
                picks.append((machine, options[0]))
                statuses[machine] = options[0].dest  # the next step starts from here
            else:
                conds = [g for _, t in picks for g in t.conditions]
                unless = [g for _, t in picks for g in t.unless]
                if satisfiable(conds, unless, known):
                    moves.extend(moves_for(c, picks, f"joint {joint.name}"))
        if c.execution not in ex.terminal_names or not settled(c.call):
            moves.append(("crash between transitions, restart", replace(c, recovering=True)))
        moves.extend(stale_owner_moves(c))
        return moves

    def stale_owner_moves(c: Pair) -> list[Move]:
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

    def woken_before_commit(p: Pair, t: TransitionSpec, when: str) -> list[Move]:
        """Recovery has read the call and decided the execution's edge `t`; before it
        commits, the stalled owner wakes and moves the call (the execution has not moved
        yet, so the owner's fence on it still passes). A commit fenced on the call conflicts
        and recovery reads again; an unfenced one lands a decision made on a call that is
        no longer there, which is a violation when the spec would decide otherwise now."""
        if not p.stale or p.call != p.stale or p.calls != p.stale_calls or settled(p.call):
            return []
        out: list[Move] = []
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

    # The tool and the recovery policy are fixed for a whole run: one run per world, sharing
    # the explorer so that the report counts the states of all four and names each violation
    # once (with the trace of the world that found it first).
    for idempotent, conservative in itertools.product((False, True), repeat=2):
        explorer.run(
            Pair(ex.initial.name, idempotent=idempotent, conservative=conservative),
            successors,
            good_end,
        )
    report.states = len(explorer.parent)
    return report
