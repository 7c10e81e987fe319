"""The model check of one lifecycle on its own.

A configuration is a record's status, whether a restart is under way, and how often its
approval was consumed. Every guard is free, so every outcome a deadline or a policy could
have is explored; a crash is inserted at every crash point of every transition and between
transitions. What depends on another record (a call's effect, its execution's fence) is left
to the product check, `spec.product_check`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lockgate.spec.crash_points import phases
from lockgate.spec.exploration import (
    Explorer,
    Move,
    Report,
    crash_effects,
    guard_note,
    point_name,
    recovery_outcomes,
    satisfiable,
)
from lockgate.spec.model import MachineSpec, TransitionKind, TransitionSpec


@dataclass(frozen=True, order=True)
class Single:
    status: str
    recovering: bool = False
    #: Capped at 2: "consumed twice" is already the violation, more would only grow the graph.
    approvals: int = 0

    def __str__(self) -> str:
        extra = " (recovering)" if self.recovering else ""
        return f"{self.status}{extra}"


def check_machine(spec: MachineSpec) -> Report:
    report = Report(name=spec.name)
    explorer = Explorer(report)
    terminal = spec.terminal_names
    # A lifecycle that names no good ends is done well at any terminal state.
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

    def successors(c: object) -> list[Move]:
        assert isinstance(c, Single)
        moves: list[Move] = []
        if c.recovering:
            for valuation, outcome in recovery_outcomes(spec, c.status, {}):
                when = guard_note(valuation, {})
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
            # Recovery edges are taken only by a restart, above.
            if t.kind is TransitionKind.RECOVERY or c.status not in t.source:
                continue
            if not satisfiable(t.conditions, t.unless, {}):
                continue
            moves.extend(transition_moves(c, t, f"{spec.name}.{t.event}"))
        if c.status not in terminal:
            moves.append(("crash between transitions, restart", replace(c, recovering=True)))
        return moves

    def transition_moves(c: Single, t: TransitionSpec, label: str) -> list[Move]:
        out: list[Move] = []
        done = fire(c, t, label)
        if done is None:
            return out
        # A recovery transition leaves the record to be looked at again.
        out.append((label, replace(done, recovering=True) if c.recovering else done))
        for phase in phases(t):
            point = point_name(spec.name, t, c.status, phase)
            report.crash_points_reached.add(point)
            committed, _ = crash_effects(t, phase)
            # A crash before the commit leaves the record as it was; the restart sees either.
            after = done if committed else c
            out.append((f"{label}, crash at {point}, restart", replace(after, recovering=True)))
        return out

    explorer.run(
        Single(spec.initial.name),
        successors,
        lambda c: isinstance(c, Single) and c.status in good_ends and not c.recovering,
    )
    return report
