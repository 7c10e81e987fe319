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
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Generic, NamedTuple, TypeVar

from lockgate.machine.bindings import BINDINGS, Facts
from lockgate.machine.errors import GuardRefused, IllegalTransition
from lockgate.machine.faults import Faults
from lockgate.machine.machines import LifecycleMachine, build_machines
from lockgate.machine.records import Change, Fence, Record
from lockgate.machine.storage import grown
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


class Decided(NamedTuple):
    """A step with the edge it takes and the change it commits."""

    step: Step
    t: TransitionSpec
    change: Change


@dataclass
class Carried:
    """Steps whose effect already ran and that have no commit of their own (an idempotent
    call's journal entry, `Composition.carried`), with the rows they need: they commit with
    the next `apply` they are handed to, ahead of its own steps, and are then cleared. Lost
    in a crash before that, which is what their transitions declare."""

    #: Each carried step as `carry` decided it, before its effect ran: its record is a row
    #: no other transaction can reach before the commit that inserts it, so the decision
    #: stands and the commit does not decide it again.
    decided: list[Decided] = field(default_factory=list)
    inserts: list[object] = field(default_factory=list)

    @property
    def steps(self) -> list[Step]:
        return [d.step for d in self.decided]


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
        #: Told about every step carried (`carry`: its effect ran, its commit waits for
        #: the next `apply`); they must not raise.
        self.carry_observers: list[Callable[[Step], None]] = []

    def _facts(self, step: Step, now: datetime) -> Facts:
        return Facts(
            now=now, record=step.record.fields, given=step.given, conservative=self.conservative
        )

    def _edge(self, step: Step, now: datetime) -> TransitionSpec:
        """The declared edge `step` takes, its guards checked (its effects not run)."""
        machine = self.machines[step.record.machine]
        return machine.decide(
            step.record.id, step.record.status, step.event, self._facts(step, now)
        )

    def decide(self, step: Step, now: datetime) -> tuple[TransitionSpec, Change]:
        facts = self._facts(step, now)
        t = self._edge(step, now)
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

    def _decide_in_order(self, steps: Sequence[Step], now: datetime) -> list[Decided]:
        """Decide each step on its record as the steps before it in the same transaction
        leave it (a call approved and then dispatched in one commit)."""
        projected: dict[tuple[str, str], Record] = {}
        decided = []
        for step in steps:
            key = (step.record.machine, step.record.id)
            at = projected.get(key, step.record)
            t, change = self.decide(replace(step, record=at), now)
            projected[key] = Record(
                at.machine, at.id, change.dest, at.version + 1, {**at.fields, **change.updates}
            )
            decided.append(Decided(step, t, change))
        return decided

    def carry(
        self,
        carried: Carried,
        step: Callable[[T], Step],
        events: Sequence[str],
        effect: Callable[[], T],
        *,
        inserts: Sequence[object] = (),
        probe: Record,
    ) -> T:
        """Run `effect` now and carry the step it settles into (`step(result)`, one of
        `events`) to the next `apply` given `carried`, with `inserts`. Each event must be
        legal on `probe` (the record as it is now) and declare an effect that comes first,
        before the effect runs: the spec decides whether a call may be made with no intent
        written first, not the caller: an event it refuses raises `GuardRefused` (or
        `IllegalTransition`) before the effect runs, and the caller may then make the call
        the way the spec allows."""
        now = self.clock()
        for event in events:
            t = self._edge(Step(probe, event), now)
            if (
                t.external_effect is None
                or t.external_effect.timing is not EffectTiming.BEFORE_COMMIT
            ):
                raise ValueError(f"{event!r} does not run its effect before its commit")
        result = effect()
        chosen = step(result)
        if chosen.event not in events:
            raise ValueError(f"{chosen.event!r} is not one of {list(events)}")
        try:
            t, change = self.decide(chosen, now)
        except (GuardRefused, IllegalTransition) as refused:
            # Its events were checked before the effect ran: a refusal now is not the
            # caller's to recover from by making the call another way.
            raise ValueError(f"{chosen.event!r} was refused after its effect ran") from refused
        if self.faults is not None:
            self.faults.reached(
                CrashPoint(change.machine, t.event, change.source, t.dest, "after_effect")
            )
        carried.decided.append(Decided(chosen, t, change))
        carried.inserts.extend(inserts)
        for observe in self.carry_observers:
            observe(chosen)
        return result

    def create(self, machine: str, row: object, writes: Sequence[object] = ()) -> None:
        """Insert one new row of `machine`, in its initial state, in a transaction of its own,
        passing its creation's crash points as a transition passes its own (the store
        refuses a row in any other state), with the store-level `writes` (a cap counted in
        the same transaction). Rows created with a transition go as `inserts`."""
        spec = self.machines[machine].spec
        if not spec.created_alone:
            raise ValueError(f"a {machine} row is only ever inserted with a transition")
        before, after = creation_points(spec)
        if self.faults is not None:
            self.faults.reached(before)
        self.store.commit(
            (), (row,), writes=writes, wait_for_disk=spec.creation_waits_for_disk
        )
        if self.faults is not None:
            self.faults.reached(after)

    def apply(
        self,
        *steps: Step,
        effect: Callable[[], T] | None = None,
        inserts: Sequence[object] = (),
        fence: Record | None = None,
        writes: Sequence[object] = (),
        carried: Carried | None = None,
    ) -> Applied[T]:
        """Move every step's record in one transaction (inserting `inserts`, new rows in
        their initial state, and making the store-level `writes`, in the same transaction);
        run `effect` if a step's transition declares an external effect. The `carried`
        steps and rows commit first in the same transaction. A record may take several
        steps: each is decided where the one before leaves it. Returns the committed
        changes and the effect's result."""
        if not steps:
            raise ValueError("apply needs at least one step")
        now = self.clock()
        ahead = carried.decided if carried is not None else []
        decided = [*ahead, *self._decide_in_order(steps, now)]
        # The carried steps' effects ran when they were carried.
        with_effect = [d.t for d in decided[len(ahead) :] if d.t.external_effect is not None]
        if len(with_effect) > 1:
            raise ValueError("one transaction may carry at most one external effect")
        if with_effect and effect is None:
            raise ValueError(f"{with_effect[0].event!r} needs its external effect to run")
        if effect is not None and not with_effect:
            raise ValueError("an effect was given but no transition here declares one")

        def points(phase: Phase) -> None:
            if self.faults is None:
                return
            for _, t, change in decided:
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
        changes = tuple(d.change for d in decided)
        # Kept when the fenced record also takes a step here: checked first, it refuses a
        # stale owner before the transaction inserts anything (a call's row another owner
        # may have inserted meanwhile would fail as a duplicate, not as the conflict it is).
        fences = (Fence(fence.machine, fence.id, fence.version),) if fence is not None else ()
        rows = [*(carried.inserts if carried is not None else ()), *inserts]
        # What the rows written here add to the bytes their executions keep (the storage
        # budget's measure), counted in the same transaction.
        writes = [*writes, *grown(rows, decided)]
        # The writes pass the same crash points as the transitions they commit with. The
        # commit waits for the disk if any of its transitions must (a store-level write
        # rides with a transition that does: a decision's token with its approval).
        waits = any(d.t.waits_for_disk for d in decided)
        self.store.commit(changes, rows, fences, writes=writes, wait_for_disk=waits)
        for observe in self.observers:
            observe(changes)
        for step, _, change in decided:
            step.record.absorb(change)
        if carried is not None:
            carried.decided.clear()
            carried.inserts.clear()
        points("after_commit")
        if timing is EffectTiming.AFTER_COMMIT and effect is not None:
            result = effect()
            points("after_effect")
        return Applied(changes, tuple(d.t for d in decided), result)
