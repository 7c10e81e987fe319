"""The one write path: every status change of every lifecycle goes through `WritePath.apply`,
and every row created on its own through `WritePath.create`.

For each step it asks the spec's machine which declared edge the event takes (refusing
undeclared ones), runs the edge's bound effects to compute column updates, and commits all
steps in ONE store transaction with optimistic concurrency. The crash points of the
transitions involved are passed in order: before commit, after commit, and around the
external effect when the transition has one (after it for intent-first effects, before the
commit for effect-first ones).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Generic, TypeVar

from lockgate.machine.bindings import BINDINGS, Facts
from lockgate.machine.faults import Faults
from lockgate.machine.machines import LifecycleMachine, build_machines
from lockgate.machine.records import Change, Fence, Record
from lockgate.machine.store import TransitionStore
from lockgate.spec.crash_points import CrashPoint, creation_points
from lockgate.spec.model import EffectTiming, Phase, TransitionSpec

T = TypeVar("T")


#: Columns only the write path itself sets.
_RESERVED = frozenset({"id", "status", "version"})


@dataclass(frozen=True)
class Step:
    """One record moved by one event, with the facts its guards and effects need.

    `data` carries plain column updates that ride along in the same transaction (logs, the
    call counter); a status can only change through the event itself.
    """

    record: Record
    event: str
    given: Mapping[str, object] = field(default_factory=dict)
    data: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        reserved = _RESERVED & set(self.data)
        if reserved:
            raise ValueError(f"{sorted(reserved)} change only through a transition")


@dataclass(frozen=True)
class Applied(Generic[T]):
    changes: tuple[Change, ...]
    transitions: tuple[TransitionSpec, ...]
    effect_result: T | None = None


def _utcnow() -> datetime:
    return datetime.now(UTC)


class WritePath:
    def __init__(
        self,
        store: TransitionStore,
        *,
        machines: Mapping[str, LifecycleMachine] | None = None,
        faults: Faults | None = None,
        clock: Callable[[], datetime] = _utcnow,
        conservative: bool = False,
    ) -> None:
        self.store = store
        self.machines = build_machines() if machines is None else machines
        #: None in production: a server nobody arms keeps no fault bookkeeping at all.
        self.faults = faults
        self.clock = clock
        self.conservative = conservative
        #: Told about every committed transaction (metrics); they must not raise.
        self.observers: list[Callable[[tuple[Change, ...]], None]] = []

    def decide(self, step: Step, now: datetime) -> tuple[TransitionSpec, Change]:
        machine = self.machines[step.record.machine]
        facts = Facts(
            now=now,
            record=step.record.fields,
            given=step.given,
            conservative=self.conservative,
        )
        t = machine.decide(step.record.id, step.record.status, step.event, facts)
        updates: dict[str, object] = {}
        updates.update(step.data)
        for name in t.effects:
            updates.update(BINDINGS[step.record.machine].effects[name](facts))
        change = Change(
            machine=step.record.machine,
            record_id=step.record.id,
            event=step.event,
            source=step.record.status,
            dest=t.dest,
            expected_version=step.record.version,
            updates=updates,
        )
        return t, change

    def create(self, machine: str, row: object) -> None:
        """Insert one new row of `machine`, in its initial state, in a transaction of its own,
        passing its creation's crash points as a transition passes its own (the store
        refuses a row in any other state). Rows created with a transition go as `inserts`."""
        spec = self.machines[machine].spec
        if not spec.created_alone:
            raise ValueError(f"a {machine} row is only ever inserted with a transition")
        before, after = creation_points(spec)
        if self.faults is not None:
            self.faults.reached(before)
        self.store.commit((), (row,))
        if self.faults is not None:
            self.faults.reached(after)

    def apply(
        self,
        *steps: Step,
        effect: Callable[[], T] | None = None,
        inserts: Sequence[object] = (),
        fence: Record | None = None,
        writes: Sequence[object] = (),
    ) -> Applied[T]:
        """Move every step's record in one transaction (inserting `inserts`, new rows in
        their initial state, and making the store-level `writes`, in the same transaction);
        run `effect` if a step's transition declares an external effect. Returns the
        committed changes and the effect's result."""
        if not steps:
            raise ValueError("apply needs at least one step")
        now = self.clock()
        decided = [self.decide(step, now) for step in steps]
        with_effect = [t for t, _ in decided if t.external_effect is not None]
        if len(with_effect) > 1:
            raise ValueError("one transaction may carry at most one external effect")
        if with_effect and effect is None:
            raise ValueError(f"{with_effect[0].event!r} needs its external effect to run")
        if effect is not None and not with_effect:
            raise ValueError("an effect was given but no transition here declares one")

        def points(phase: Phase) -> None:
            if self.faults is None:
                return
            for t, change in decided:
                if t.durable:
                    self.faults.reached(
                        CrashPoint(change.machine, t.event, change.source, t.dest, phase)
                    )

        external = with_effect[0].external_effect if with_effect else None
        timing = external.timing if external is not None else None
        result: T | None = None
        if timing is EffectTiming.BEFORE_COMMIT and effect is not None:
            result = effect()
            points("after_effect")
        points("before_commit")
        changes = tuple(change for _, change in decided)
        fences = (Fence(fence.machine, fence.id, fence.version),) if fence is not None else ()
        # The writes pass the same crash points as the transitions they commit with.
        self.store.commit(changes, inserts, fences, writes=writes)
        for observe in self.observers:
            observe(changes)
        for step, change in zip(steps, changes, strict=True):
            step.record.absorb(change)
        points("after_commit")
        if timing is EffectTiming.AFTER_COMMIT and effect is not None:
            result = effect()
            points("after_effect")
        return Applied(changes, tuple(t for t, _ in decided), result)
