"""One composition's section of the README: the joint steps that commit transitions of two
machines in one transaction, the constraints between the machines, and their fences.

A composition has no drawing of its own; its machines are drawn one by one, and this section
says how they move together.
"""

from __future__ import annotations

from collections.abc import Sequence

from lockgate.spec.diagram_markdown import code_list, table_row
from lockgate.spec.model import Composition


def composition_section(comp: Composition) -> list[str]:
    out = [
        f"## Composition: {comp.name}",
        "",
        f"Machines {code_list(comp.machines)}. {comp.description}",
        "",
        "### Joint steps (one transaction)",
        "",
        "| Joint step | Transitions committed together | Meaning |",
        "| --- | --- | --- |",
    ]
    for step in comp.joint_steps:
        together = " + ".join(f"`{m}.{e}`" for m, e in step.steps)
        out.append(table_row([f"`{step.name}`", together, step.description]))
    if comp.requires:
        other = {comp.machines[0]: comp.machines[1], comp.machines[1]: comp.machines[0]}
        out.extend(
            [
                "",
                "### Constraints",
                "",
                "| Transition | Fires only while the other machine is in |",
                "| --- | --- |",
            ]
        )
        for (machine, event), states in comp.requires:
            where = f"`{other.get(machine, '?')}`: {code_list(states)}"
            out.append(table_row([f"`{machine}.{event}`", where]))
    first, second = comp.machines
    if comp.fenced:
        out.extend(
            _section(
                "Fences",
                f"{_events(comp.fenced)} commit only while the `{first}` record is still at "
                "the version their actor read: an instance whose work was recovered by "
                "another cannot move the call any more.",
            )
        )
    if comp.recovery_fenced:
        out.extend(
            [
                "",
                f"{_events(comp.recovery_fenced)} commit only while the latest `{second}` "
                "record is still at the version recovery read (or moved in the same "
                "transaction): an owner that wakes between recovery's read and its commit "
                "and moves the call makes the commit conflict, and recovery decides again.",
            ]
        )
    if comp.carried:
        out.extend(
            _section(
                "Carried steps (no commit of their own)",
                f"{_events(comp.carried)} commit with the next durable step of their "
                f"`{first}` record, in its transaction (a call that must not run twice, a "
                "pause, the end, a hand back). A crash before that commit loses them: the "
                "record goes on from its last durable step and they happen again, which "
                "their guards allow.",
            )
        )
    out.append("")
    return out


def _events(events: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"`{m}.{e}`" for m, e in events)


def _section(title: str, text: str) -> list[str]:
    return ["", f"### {title}", "", text]
