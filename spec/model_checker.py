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

The pieces live in their own modules: `spec.exploration` (reports, recovery outcomes, crash
effects, the breadth-first explorer), `spec.lifecycle_check` (one lifecycle) and
`spec.product_check` (execution x tool call). This module is the entry point and keeps the
names other code imports from it.
"""

from __future__ import annotations

from collections.abc import Mapping

from lockgate.spec.exploration import (
    INVARIANTS,
    RecoveryOutcome,
    Report,
    Valuation,
    Violation,
    recovery_outcomes,
)
from lockgate.spec.lifecycle_check import Single, check_machine
from lockgate.spec.model import Composition, MachineSpec
from lockgate.spec.product_check import (
    MAX_CALLS,
    NO_CALL,
    PRODUCT_INVARIANTS,
    Pair,
    check_composition,
)

__all__ = [
    "INVARIANTS",
    "MAX_CALLS",
    "NO_CALL",
    "PRODUCT_INVARIANTS",
    "Pair",
    "RecoveryOutcome",
    "Report",
    "Single",
    "Valuation",
    "Violation",
    "check_all",
    "check_composition",
    "check_machine",
    "recovery_outcomes",
]


def check_all(
    machines: Mapping[str, MachineSpec], compositions: Mapping[str, Composition]
) -> list[Report]:
    """Every lifecycle on its own, then every composition, in the order given."""
    reports = [check_machine(spec) for spec in machines.values()]
    reports.extend(check_composition(c, machines) for c in compositions.values())
    return reports
