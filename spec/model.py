"""The vocabulary every lifecycle is declared in.

A lifecycle is a `MachineSpec`: states, transitions, and for every non-terminal state what a
crash does to it. These are plain pydantic models, frozen, so a declaration is validated the
moment it is built and cannot be changed afterwards. The structural rules that need the whole
machine (reachability, recovery edges, ambiguity) live in `spec.checks`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

IDENTIFIER = r"^[a-z][a-z0-9_]*$"


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


class Otherwise(StrEnum):
    """What happens to a state after a crash when none of its recovery events applies."""

    #: Nothing has to run for it: the row waits for an outside event (a person, a client).
    DURABLE_WAIT = "durable_wait"
    #: A live instance claims it through the ordinary claim path and carries on.
    RECLAIM = "reclaim"


class OnCrash(Frozen):
    """A state's recovery edge: what a restart, or the death of its owner, does to it.

    Recovery tries `events` in order and fires the first whose guards hold. When none holds,
    `otherwise` says why the state is still safe; with no `otherwise` the state would be
    stranded, which the model checker reports.
    """

    events: tuple[str, ...] = ()
    otherwise: Otherwise | None = None
    why: str = Field(min_length=1)

    @model_validator(mode="after")
    def _says_something(self) -> OnCrash:
        if not self.events and self.otherwise is None:
            raise ValueError("on_crash needs recovery events, an `otherwise`, or both")
        return self


def durable_wait(why: str) -> OnCrash:
    return OnCrash(otherwise=Otherwise.DURABLE_WAIT, why=why)


def reclaim(why: str) -> OnCrash:
    return OnCrash(otherwise=Otherwise.RECLAIM, why=why)


def recover_by(*events: str, why: str, otherwise: Otherwise | None = None) -> OnCrash:
    return OnCrash(events=events, otherwise=otherwise, why=why)


class StateSpec(Frozen):
    name: str = Field(pattern=IDENTIFIER)
    description: str = Field(min_length=1)
    initial: bool = False
    terminal: bool = False
    #: True when a live process works on the record while it is in this state (so the
    #: process's death leaves it without an owner until recovery moves or reclaims it).
    owned: bool = False
    on_crash: OnCrash | None = None

    @model_validator(mode="after")
    def _terminal_is_final(self) -> StateSpec:
        if self.terminal and (self.owned or self.on_crash is not None):
            raise ValueError(f"terminal state {self.name!r} cannot be owned or have on_crash")
        return self


class EffectTiming(StrEnum):
    #: Intent first: the transition commits, then the effect runs (tool dispatch). A crash
    #: between the two leaves the record saying the effect may have happened.
    AFTER_COMMIT = "after_commit"
    #: Effect first: the effect runs, then the transition commits (a response written to a
    #: client). A crash between the two leaves the record saying it has not happened yet.
    BEFORE_COMMIT = "before_commit"


class ExternalEffect(Frozen):
    name: str = Field(pattern=IDENTIFIER)
    timing: EffectTiming = EffectTiming.AFTER_COMMIT
    #: Whether doing it twice is visible to the world (a non-idempotent tool call is).
    description: str = Field(min_length=1)


class TransitionKind(StrEnum):
    NORMAL = "normal"
    #: Fired only by recovery, never by a client or the engine's normal course.
    RECOVERY = "recovery"


class TransitionSpec(Frozen):
    event: str = Field(pattern=IDENTIFIER)
    source: tuple[str, ...] = Field(min_length=1)
    dest: str
    description: str = Field(min_length=1)
    kind: TransitionKind = TransitionKind.NORMAL
    #: All must hold (guard names bound by the machine layer).
    conditions: tuple[str, ...] = ()
    #: None may hold.
    unless: tuple[str, ...] = ()
    #: Named actions run inside the transition's transaction (bound by the machine layer).
    effects: tuple[str, ...] = ()
    external_effect: ExternalEffect | None = None
    #: Written to the store in its own transaction (every crash point hangs off this).
    durable: bool = True
    #: Its commit returns only once the disk has it. False: committed without waiting
    #: (SQLite `synchronous=NORMAL` for that transaction, PostgreSQL `synchronous_commit =
    #: off`): it survives the process's death like any commit and reaches the disk with the
    #: next commit that waits (the log is written in order); only an OS crash or a power
    #: loss before that can lose it. For bookkeeping whose loss costs a report, never an
    #: effect or a decision: an intent-first effect or a consumed approval must wait.
    waits_for_disk: bool = True
    #: This edge uses up a person's decision; the checker proves it happens at most once.
    consumes_approval: bool = False
    #: This edge ends a dispatch whose tool did not act (it asked its user for values
    #: first, by contract): the checker counts no effect for that dispatch.
    effect_not_made: bool = False

    def edges(self) -> tuple[tuple[str, str], ...]:
        return tuple((s, self.dest) for s in self.source)

    def guard_names(self) -> tuple[str, ...]:
        return self.conditions + self.unless


class MachineSpec(Frozen):
    """One lifecycle. `status` is the enum the rest of the code uses for its states."""

    name: str = Field(pattern=IDENTIFIER)
    title: str
    description: str = Field(min_length=1)
    status: type[StrEnum]
    states: tuple[StateSpec, ...] = Field(min_length=1)
    transitions: tuple[TransitionSpec, ...] = Field(min_length=1)
    #: Terminal states that count as a good end for the "every X ends ..." invariant; empty
    #: means every terminal state is a good end.
    good_ends: tuple[str, ...] = ()
    #: Rows are inserted in a transaction of their own, so their creation has crash points
    #: of its own (`<machine>:create:new-><initial>:before_commit|after_commit`). False for
    #: rows always inserted with another record's transition (a tool call is inserted with
    #: its execution's checkpoint, whose points it shares).
    created_alone: bool = True
    #: Whether the insert of a row created alone waits for the disk (as
    #: `TransitionSpec.waits_for_disk`).
    creation_waits_for_disk: bool = True

    def state(self, name: str) -> StateSpec:
        for s in self.states:
            if s.name == name:
                return s
        raise KeyError(f"{self.name}: no state {name!r}")

    @property
    def initial(self) -> StateSpec:
        return next(s for s in self.states if s.initial)

    @property
    def terminal_names(self) -> frozenset[str]:
        return frozenset(s.name for s in self.states if s.terminal)

    @property
    def live_names(self) -> frozenset[str]:
        """The non-terminal states: a record in one of them may still change."""
        return frozenset(s.name for s in self.states if not s.terminal)

    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.states)

    def transitions_for(self, event: str) -> tuple[TransitionSpec, ...]:
        return tuple(t for t in self.transitions if t.event == event)

    def events(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for t in self.transitions:
            seen.setdefault(t.event, None)
        return tuple(seen)

    def guard_names(self) -> frozenset[str]:
        return frozenset(g for t in self.transitions for g in t.guard_names())

    def effect_names(self) -> frozenset[str]:
        return frozenset(e for t in self.transitions for e in t.effects)


class JointStep(Frozen):
    """Transitions that commit in ONE transaction, in this order (a record may take several
    of them: each starts where the one before left it)."""

    name: str = Field(pattern=IDENTIFIER)
    steps: tuple[tuple[str, str], ...] = Field(min_length=2)  # (machine, event)
    description: str = Field(min_length=1)


class Composition(Frozen):
    """How two lifecycles move together; the model checker explores their product."""

    name: str = Field(pattern=IDENTIFIER)
    machines: tuple[str, str]
    joint_steps: tuple[JointStep, ...]
    #: (machine, event) -> {other machine: states it must be in for the event to fire}.
    requires: tuple[tuple[tuple[str, str], tuple[str, ...]], ...] = ()
    #: (machine, event) of the second machine's transitions that commit only while the
    #: first machine's record is still at the version their actor read (a fence): an
    #: instance that lost the execution (stalled, declared dead, its work recovered by
    #: another) cannot move the execution's call any more, though the call's own row did not
    #: change. The model checker lets such a stale owner try every move of the call.
    fenced: tuple[tuple[str, str], ...] = ()
    #: (machine, event) of the first machine's recovery transitions that commit only while
    #: the second machine's record is still at the version recovery read: recovery decides
    #: on the call as it read it, so a stalled owner that wakes between that read and the
    #: commit (its execution not yet moved, so its own fence still passes) and moves the
    #: call makes the commit conflict, and recovery decides again. The model checker lets
    #: the stale owner move in that window.
    recovery_fenced: tuple[tuple[str, str], ...] = ()
    #: (machine, event) of the second machine's transitions that have no commit of their
    #: own: they commit with the next durable step of the first machine's record, in its
    #: transaction (an idempotent call's journal entry rides with its execution's next
    #: checkpoint, pause or end). A crash before that commit loses them, which the model
    #: explores as the crash points of the transition itself.
    carried: tuple[tuple[str, str], ...] = ()
    description: str = Field(min_length=1)


Phase = Literal["before_commit", "after_commit", "after_effect"]
