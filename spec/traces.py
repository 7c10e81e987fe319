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
  version the replay has that execution at (a stale owner's step would name an older one),
  or together with a step of that execution, whose own version check fences it;
- a carried step (`Composition.carried`) committed together with a step of its execution;
- a recovery step fenced on the call (`Composition.recovery_fenced`) committed under a fence
  on the execution's latest call at the version the replay has it at, or together with a
  step on that call.

Rows written before the log recorded transactions and fences (no `txn`) skip those two
checks; the others apply to every row.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from lockgate.spec.model import Composition, MachineSpec


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
    # A step of the execution itself in the same transaction checks the execution's
    # version: it fences the call's step as a fence would (and a carried step has it).
    with_first = other_key is not None and any(
        s.machine == first and s.record_id == other_key[1] for s in by_txn.get(step.txn, [])
    )
    if (step.machine, step.event) in set(comp.carried) and not with_first:
        out.append(f"{said}: carried, but committed without a step of its {first}")
    if (step.machine, step.event) in set(comp.fenced) and other_key is not None:
        expected = f"{first}:{other_key[1]}:{version.get(other_key, 0)}"
        fences = (step.fence or "").split(",")
        if expected not in fences and not with_first:
            out.append(
                f"{said}: committed under fence {step.fence!r}, not its {first} as the trace "
                f"has it ({expected})"
            )
    if (step.machine, step.event) in set(comp.recovery_fenced) and step.txn is not None:
        problem = _recovery_fence(step, said, comp, version, children, parents, by_txn)
        if problem:
            out.append(problem)
    return out


def _recovery_fence(
    step: LoggedStep,
    said: str,
    comp: Composition,
    version: Mapping[tuple[str, str], int],
    children: Mapping[tuple[str, str], list[str]],
    parents: Mapping[str, str],
    by_txn: Mapping[str, list[LoggedStep]],
) -> str | None:
    """Recovery decided the execution's edge on its latest call as it read it: the commit
    is fenced on that call at the version the trace has it, or moves a call of the
    execution in the same transaction (whose own version check guards it then). Calls are
    created without a logged step, so a call none of whose steps the log holds yet is
    unknown to the trace: a fence on it is taken at any version, and an execution none of
    whose calls moved yet is not judged. A fence on an older call than the latest the
    trace knows is refused."""
    first, second = comp.machines
    known = children.get((first, step.record_id), [])
    if not known:
        return None
    latest = known[-1]
    calls = {c for c, parent in parents.items() if parent == step.record_id}
    assert step.txn is not None
    if any(s.machine == second and s.record_id in calls for s in by_txn.get(step.txn, [])):
        return None
    for fence in (step.fence or "").split(","):
        machine, _, rest = fence.partition(":")
        record_id, _, fenced_version = rest.rpartition(":")
        if machine != second or record_id not in calls:
            continue
        if record_id == latest and fenced_version == str(version.get((second, record_id))):
            return None
        if record_id not in known:
            return None
    expected = f"{second}:{latest}:{version.get((second, latest))}"
    return (
        f"{said}: committed under fence {step.fence!r}, not its latest {second} as the "
        f"trace has it ({expected})"
    )


__all__ = ["LoggedStep", "check_trace"]
