"""A persisted trace checked against the model: what the code did is what the spec allows.

The model checker explores the spec; the simulator and the tests run the code. This module
joins them: it replays the transition log the code wrote, step by step, through the same
declarations the model checker explores, and names every step the model would not have
taken from the state the replay is in:

- the step is a declared edge of its lifecycle, leaving the state its record was in (its
  lifecycle's initial state if the record is new), with the record's next version;
- a composition's constraints hold: a call moves only while its execution is in the states
  `requires` names, and an execution finishes only once its current call settled;
- a step that the model only takes jointly (a pause with its call's request for approval)
  committed in the same transaction as its partner on the related record;
- a fenced step (`Composition.fenced`) committed under a fence on its execution, at the
  version the replay has that execution at: a stale owner's step would name an older one.

Rows written before the log recorded transactions and fences (no `txn`) skip those two
checks; the others apply to every row.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from spec.model import Composition, MachineSpec


@dataclass(frozen=True)
class LoggedStep:
    """One row of the transition log."""

    id: int
    machine: str
    record_id: str
    event: str
    source: str
    dest: str
    version: int
    txn: str | None = None
    fence: str | None = None


def check_trace(
    steps: Iterable[LoggedStep],
    parents: Mapping[str, str],
    machines: Mapping[str, MachineSpec],
    compositions: Mapping[str, Composition],
) -> list[str]:
    """Every disagreement between the trace and the model, in log order. `parents` maps
    each record of a composition's second machine (a call) to its first's (its execution).
    """
    ordered = sorted(steps, key=lambda s: s.id)
    edges = {
        name: {(t.event, src, t.dest) for t in spec.transitions for src in t.source}
        for name, spec in machines.items()
    }
    state: dict[tuple[str, str], str] = {}
    version: dict[tuple[str, str], int] = {}
    #: (first machine, parent id) -> the second machine's records seen, latest last.
    children: dict[tuple[str, str], list[str]] = defaultdict(list)
    by_txn: dict[str, list[LoggedStep]] = defaultdict(list)
    for step in ordered:
        if step.txn is not None:
            by_txn[step.txn].append(step)
    problems: list[str] = []
    for step in ordered:
        said = (
            f"log row {step.id}: {step.machine} {step.record_id} {step.event} "
            f"{step.source}->{step.dest}"
        )
        spec = machines.get(step.machine)
        if spec is None:
            problems.append(f"{said}: no lifecycle {step.machine!r}")
            continue
        key = (step.machine, step.record_id)
        if (step.event, step.source, step.dest) not in edges[step.machine]:
            problems.append(f"{said}: not an edge of the spec")
        before = state.get(key, spec.initial.name)
        if step.source != before:
            problems.append(f"{said}: the record was {before!r}")
        expected_version = version.get(key)
        if expected_version is not None and step.version != expected_version + 1:
            problems.append(f"{said}: version {step.version} after {expected_version}")
        for comp in compositions.values():
            problems += _composition(step, said, comp, state, version, children, parents, by_txn)
        state[key] = step.dest
        version[key] = step.version
    return problems


def _composition(
    step: LoggedStep,
    said: str,
    comp: Composition,
    state: Mapping[tuple[str, str], str],
    version: Mapping[tuple[str, str], int],
    children: dict[tuple[str, str], list[str]],
    parents: Mapping[str, str],
    by_txn: Mapping[str, list[LoggedStep]],
) -> list[str]:
    first, second = comp.machines
    if step.machine not in comp.machines:
        return []
    out: list[str] = []
    other_key: tuple[str, str] | None
    if step.machine == second:
        parent = parents.get(step.record_id)
        if parent is None:
            return [f"{said}: no {first} is known for it"]
        if step.record_id not in children[(first, parent)]:
            children[(first, parent)].append(step.record_id)
        other_key = (first, parent)
    else:
        kids = children.get((step.machine, step.record_id), [])
        other_key = (second, kids[-1]) if kids else None
    other_machine = second if step.machine == first else first
    requires = {k: set(v) for k, v in comp.requires}
    need = requires.get((step.machine, step.event))
    if need is not None and other_key is not None:
        other_state = state.get(other_key)
        if other_state is not None and other_state not in need:
            out.append(f"{said}: its {other_machine} is {other_state!r}, not one of {sorted(need)}")
    if step.txn is None:
        return out
    joint = [j for j in comp.joint_steps if (step.machine, step.event) in j.steps]
    if joint and (step.machine, step.event) not in requires:
        together = {(s.machine, s.event, s.record_id) for s in by_txn.get(step.txn, [])}
        partners = [
            (m, e) for j in joint for (m, e) in j.steps if (m, e) != (step.machine, step.event)
        ]
        related = other_key[1] if other_key is not None else None
        if step.machine == first and related is None:
            # A joint step needs the current call: the execution has none in the trace yet.
            out.append(f"{said}: a joint step without its {second}")
        elif not any((m, e, related) in together for m, e in partners):
            names = ", ".join(f"{m}.{e}" for m, e in partners)
            out.append(f"{said}: committed without its partner ({names}) in one transaction")
    if (step.machine, step.event) in set(comp.fenced) and other_key is not None:
        expected = f"{first}:{other_key[1]}:{version.get(other_key, 0)}"
        fences = (step.fence or "").split(",")
        if expected not in fences:
            out.append(
                f"{said}: committed under fence {step.fence!r}, not its {first} as the trace "
                f"has it ({expected})"
            )
    return out


__all__ = ["LoggedStep", "check_trace"]
