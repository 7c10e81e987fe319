"""One lifecycle machine's section of the README: its Mermaid diagram, links to its Graphviz
files, and the tables of its states, its transitions and every crash point it has.

The tables say in full what the diagrams abbreviate (a diagram labels only the crash points
that are notable), so the README is where every state, edge and crash point can be looked up.
"""

from __future__ import annotations

from lockgate.spec.crash_points import CrashPoint, creation_points, every_crash_point
from lockgate.spec.diagram_markdown import code_list, table_row
from lockgate.spec.diagram_mermaid import render_mermaid
from lockgate.spec.diagram_style import (
    APPROVAL,
    CRASH,
    RECOVERY,
    crash_label,
    state_kinds,
    timing_text,
)
from lockgate.spec.model import MachineSpec, TransitionKind


def _crash_point_section(spec: MachineSpec) -> list[str]:
    """Every crash point of the machine, one row per edge (creation first), by full name."""
    points = every_crash_point(spec)
    created = frozenset(creation_points(spec))
    by_edge: dict[tuple[str, str, str], list[CrashPoint]] = {}
    for p in points:
        by_edge.setdefault((p.event, p.source, p.dest), []).append(p)
    transition_of = {(t.event, s, d): t for t in spec.transitions for s, d in t.edges()}
    creation = (
        "Its rows are inserted in a transaction of their own, so creating one has points of "
        "its own (the first row)."
        if created
        else "No creation points: its rows are never inserted on their own (each is written "
        "in the transaction of another record's transition, whose points it shares)."
    )
    out = [
        "",
        "### Crash points",
        "",
        f"{len(points)} crash points, as `lockgate spec check` counts them, each named "
        "`<edge>:<phase>` (the names `lockgate simulate --crash-at` takes), in the order the "
        f"write path passes them. {creation} The diagram labels only the edges marked "
        f"{CRASH} (see [How to read the diagrams](#how-to-read-the-diagrams)).",
        "",
        "| Edge | Of | Phases, in order | Label on the diagram |",
        "| --- | --- | --- | --- |",
    ]
    for (event, source, dest), edge_points in by_edge.items():
        name = edge_points[0].name.rsplit(":", 1)[0]
        phases_ = ", ".join(f"`{p.phase}`" for p in edge_points)
        if edge_points[0] in created:
            of, drawn = "creation", ""
        else:
            t = transition_of[(event, source, dest)]
            of, drawn = f"`{event}`", crash_label(t)
        out.append(table_row([f"`{name}`", of, phases_, drawn]))
    return out


def machine_section(spec: MachineSpec) -> list[str]:
    out = [
        f"## {spec.title}",
        "",
        f"Machine `{spec.name}`. {spec.description}",
        "",
        "```mermaid",
        render_mermaid(spec).rstrip("\n"),
        "```",
        "",
        f"Graphviz: [{spec.name}.svg]({spec.name}.svg) (source [{spec.name}.dot]({spec.name}.dot));"
        f" Mermaid source: [{spec.name}.mmd]({spec.name}.mmd).",
        "",
        "### States",
        "",
        "| State | Kind | Meaning | On crash: recovery events, in order | Why a crash is safe |",
        "| --- | --- | --- | --- | --- |",
    ]
    for s in spec.states:
        if s.on_crash is None:
            events, why = "", "(terminal: nothing to recover)"
        else:
            events = code_list(s.on_crash.events)
            if s.on_crash.otherwise is not None:
                fallback = str(s.on_crash.otherwise.value).replace("_", " ")
                events = f"{events}, else {fallback}" if events else fallback
            why = s.on_crash.why
        out.append(table_row([f"`{s.name}`", state_kinds(s), s.description, events, why]))
    if spec.good_ends:
        out.extend(["", f"Good ends: {code_list(spec.good_ends)}."])
    lazy = [f"`{t.event}`" for t in spec.transitions if not t.waits_for_disk]
    if spec.created_alone and not spec.creation_waits_for_disk:
        lazy.insert(0, "its creation")
    if lazy:
        out.extend(
            [
                "",
                f"Committed without waiting for the disk: {', '.join(lazy)}. Such a commit "
                "survives the process's death and reaches the disk with the next commit that "
                "waits; only an OS crash or a power loss before that can lose it.",
            ]
        )
    out.extend(
        [
            "",
            "### Transitions",
            "",
            "| Event | Kind | From | To | Guards | Effects | External effect | Approval "
            "| Meaning |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
    )
    for t in spec.transitions:
        external = f"`{t.external_effect.name}` ({timing_text(t)})" if t.external_effect else ""
        guards = [*(f"`{g}`" for g in t.conditions), *(f"`!{g}`" for g in t.unless)]
        out.append(
            table_row(
                [
                    f"`{t.event}`",
                    f"{RECOVERY} recovery" if t.kind is TransitionKind.RECOVERY else "normal",
                    code_list(t.source),
                    f"`{t.dest}`",
                    ", ".join(guards),
                    code_list(t.effects),
                    external,
                    f"{APPROVAL} consumes" if t.consumes_approval else "",
                    t.description,
                ]
            )
        )
    out.extend(_crash_point_section(spec))
    out.append("")
    return out
