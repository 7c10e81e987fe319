"""`transitions` machines built from the spec: they decide which declared edge an event takes.

Built with `auto_transitions=False`, so the spec's edges are the only ones. One machine per
lifecycle serves every record: a short-lived probe holding the record's stored status is
handed to the event, and the chosen transition is read back. The probe is never registered
with the machine (`add_model`): the machine is shared by every thread of the process, and
`transitions` finds registered models by equality, so two threads deciding for records with
equal status and facts would see each other's probe and one would be left without a
trigger. Triggering the event directly touches no shared state. The stored status, not a
Python attribute, stays the truth; the write path does the writing.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from transitions import Machine, MachineError

from lockgate.machine.bindings import BINDINGS, Facts, MachineBindings, binding_names
from lockgate.machine.errors import GuardRefused, IllegalTransition
from lockgate.spec import MACHINES, MachineSpec, TransitionSpec, load

# `transitions` logs every callback at INFO; our write path logs what matters.
logging.getLogger("transitions").setLevel(logging.WARNING)


@dataclass(eq=False)
class _Probe:
    """A throwaway model: the record's status and the facts guards may read."""

    state: str
    facts: Facts
    chosen: TransitionSpec | None = field(default=None)


class LifecycleMachine:
    """Decides transitions for every record of one lifecycle."""

    def __init__(self, spec: MachineSpec, bindings: MachineBindings) -> None:
        self.spec = spec
        # Asked at every decision: the spec builds both anew each time it is asked (a fifth
        # of a decision's cost).
        self._states = frozenset(spec.state_names)
        self._events = frozenset(spec.events())
        self._machine = Machine(
            model=None,
            states=list(spec.state_names),
            initial=spec.initial.name,
            transitions=[self._declare(t, bindings) for t in spec.transitions],
            auto_transitions=False,
            send_event=True,
            ignore_invalid_triggers=False,
            name=spec.name,
        )

    @staticmethod
    def _declare(t: TransitionSpec, bindings: MachineBindings) -> dict[str, Any]:
        def guard(name: str) -> Any:
            # Looked up at each decision, not when built: the machines are built once per
            # process, and a guard bound later (a test's planted bug) must still be the one
            # that decides.
            return lambda event: bindings.guards[name](event.model.facts)

        def remember(event: Any) -> None:
            event.model.chosen = t

        return {
            "trigger": t.event,
            "source": list(t.source),
            "dest": t.dest,
            "conditions": [guard(g) for g in t.conditions],
            "unless": [guard(g) for g in t.unless],
            "before": [remember],
        }

    def decide(self, record_id: str, status: str, event: str, facts: Facts) -> TransitionSpec:
        """The declared transition `event` takes from `status` given `facts`.

        Raises `IllegalTransition` when the spec declares no such event from this state,
        and `GuardRefused` when it does but no guard holds."""
        if status not in self._states or event not in self._events:
            raise IllegalTransition(
                machine=self.spec.name, record_id=record_id, event=event, source=status
            )
        probe = _Probe(state=status, facts=facts)
        try:
            fired = self._machine.events[event].trigger(probe)
        except MachineError:
            raise IllegalTransition(
                machine=self.spec.name, record_id=record_id, event=event, source=status
            ) from None
        if not fired or probe.chosen is None:
            raise GuardRefused(
                machine=self.spec.name, record_id=record_id, event=event, source=status
            )
        return probe.chosen


def build_machines(
    specs: Mapping[str, MachineSpec] | None = None,
) -> Mapping[str, LifecycleMachine]:
    """Every lifecycle, validated against the spec rules and the bindings: the spec's own
    built once per process (they hold no record's state, and each boot of an incarnation,
    in the simulator hundreds a minute, would otherwise build them again)."""
    if specs is None:
        return _the_spec_machines()
    chosen = load(specs, bindings=binding_names())
    return {name: LifecycleMachine(spec, BINDINGS[name]) for name, spec in chosen.items()}


@functools.cache
def _the_spec_machines() -> Mapping[str, LifecycleMachine]:
    chosen = load(MACHINES, bindings=binding_names())
    return MappingProxyType(
        {name: LifecycleMachine(spec, BINDINGS[name]) for name, spec in chosen.items()}
    )
