"""The Graphviz DOT drawing of one lifecycle machine (`render_dot`), and the DOT primitives
the legend's drawing shares with it (quoting, attribute lists, node and edge styles).

The text is built by hand in declaration order, never through a Graphviz library, so the same
spec gives the same bytes: the committed `.dot` files are compared exactly by `drift`.
"""

from __future__ import annotations

from collections.abc import Iterable

from lockgate.spec.diagram_style import (
    APPROVAL,
    COLORS,
    COMMAND,
    EXTERNAL,
    LEGEND_NAME,
    RECOVERY,
    crash_label,
    crash_summary,
    event_text,
    merge_id,
    state_kind,
    timing_text,
)
from lockgate.spec.model import MachineSpec, StateSpec, TransitionKind, TransitionSpec

#: The marker of the initial state, in every diagram and in the legend: a small black point.
INITIAL_POINT: tuple[tuple[str, str], ...] = (("shape", "point"), ("width", "0.2"), ("label", ""))


def quote(text: str) -> str:
    """A double-quoted DOT string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def html_text(text: str) -> str:
    """`text` escaped for a Graphviz HTML-like label (`<b>...</b>`)."""
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )


def attr_list(pairs: Iterable[tuple[str, str]]) -> str:
    """`[a="x", b=<html>]`; values starting with `<` are HTML-like labels, left unquoted."""
    rendered = [f"{k}={v if v.startswith('<') else quote(v)}" for k, v in pairs]
    return "[" + ", ".join(rendered) + "]"


def _state_style(state: StateSpec) -> list[tuple[str, str]]:
    return kind_style(state_kind(state))


def kind_style(kind: str) -> list[tuple[str, str]]:
    if kind == "terminal":
        return [
            ("shape", "box"),
            ("style", "rounded,filled,bold"),
            ("peripheries", "2"),
            ("fillcolor", COLORS["terminal_fill"]),
            ("color", COLORS["terminal_line"]),
        ]
    if kind == "owned":
        return [
            ("shape", "box"),
            ("style", "rounded,filled"),
            ("fillcolor", COLORS["owned_fill"]),
            ("color", COLORS["owned_line"]),
        ]
    return [
        ("shape", "box"),
        ("style", "rounded,filled"),
        ("fillcolor", COLORS["wait_fill"]),
        ("color", COLORS["wait_line"]),
    ]


def _state_label(state: StateSpec) -> str:
    title = f"<b>{html_text(state.name)}</b>"
    if state.terminal:
        return f"<{title}>"
    kind = "owned" if state.owned else "durable wait"
    crash = crash_summary(state)
    detail = kind if crash in ("", kind) else f"{kind}; crash {RECOVERY} {crash}"
    return f'<{title}<br/><font point-size="9">{html_text(detail)}</font>>'


def edge_label_lines(t: TransitionSpec) -> list[str]:
    """The lines of a DOT edge label: event and guards, effects, external effect, approval,
    and crash points where they are notable (`crash_label`)."""
    lines = [event_text(t, ", ")]
    if t.effects:
        lines.append("/ " + ", ".join(t.effects))
    if t.external_effect is not None:
        lines.append(f"{EXTERNAL} {t.external_effect.name} ({timing_text(t)})")
    if t.consumes_approval:
        lines.append(f"{APPROVAL} consumes approval")
    marker = crash_label(t)
    if marker:
        lines.append(marker)
    return lines


def _edge_style(t: TransitionSpec) -> list[tuple[str, str]]:
    styles: list[str] = []
    color = COLORS["normal"]
    if t.kind is TransitionKind.RECOVERY:
        styles.append("dashed")
        color = COLORS["recovery"]
    elif t.consumes_approval:
        color = COLORS["approval"]
    if t.external_effect is not None:
        styles.append("bold")
    return [
        ("style", ",".join(styles) if styles else "solid"),
        ("color", color),
        ("fontcolor", color),
    ]


def _dot_label(lines: Iterable[str]) -> str:
    """A multi-line DOT label, quoted (`\\n` between lines)."""
    return '"' + "\\n".join(line.replace("\\", "\\\\").replace('"', '\\"') for line in lines) + '"'


def edge(source: str, dest: str, label: Iterable[str], attrs: list[tuple[str, str]]) -> str:
    """`"a" -> "b" [label="...", k="v"];`, the label first when there is one."""
    rendered = [f"{k}={quote(v)}" for k, v in attrs]
    lines = list(label)
    if lines:
        rendered.insert(0, f"label={_dot_label(lines)}")
    return f"  {quote(source)} -> {quote(dest)} [{', '.join(rendered)}];"


def junction_attrs(color: str) -> list[tuple[str, str]]:
    """A junction: a small filled diamond in the colour of its transition's edges."""
    return [
        ("shape", "diamond"),
        ("label", ""),
        ("width", "0.16"),
        ("height", "0.16"),
        ("fixedsize", "true"),
        ("style", "filled"),
        ("fillcolor", color),
        ("color", color),
    ]


def _dot_transition(index: int, t: TransitionSpec) -> list[str]:
    """One edge for a transition from one state; for one from several, a junction, an
    unlabelled line into it from each source and the one labelled arrow out of it."""
    label = edge_label_lines(t)
    style = _edge_style(t)
    if len(t.source) == 1:
        return [edge(t.source[0], t.dest, label, style)]
    junction = f"__{merge_id(index, t)}"
    color = dict(style)["color"]
    lines = [f"  {quote(junction)} {attr_list([*junction_attrs(color), ('tooltip', t.event)])};"]
    # Weights: the junction sits level with, and just before, its destination, so the lines
    # from the sources run to it instead of the labelled arrow running across the machine.
    line_style = [
        ("style", dict(style)["style"]),
        ("color", color),
        ("arrowhead", "none"),
        ("weight", "0"),
    ]
    lines.extend(edge(source, junction, [], line_style) for source in t.source)
    lines.append(edge(junction, t.dest, label, [*style, ("weight", "8")]))
    return lines


def graph_attrs(title: str, subtitle: str) -> str:
    label = f'<{html_text(title)}<br/><font point-size="10">{html_text(subtitle)}</font>>'
    return "  " + attr_list(
        [
            ("label", label),
            ("labelloc", "t"),
            ("fontname", "Helvetica"),
            ("fontsize", "18"),
            ("rankdir", "LR"),
            ("nodesep", "0.5"),
            ("ranksep", "0.6"),
            ("newrank", "true"),
            ("bgcolor", "white"),
        ]
    ).join(["graph ", ";"])


def default_attrs() -> list[str]:
    return [
        "  "
        + attr_list(
            [("fontname", "Helvetica"), ("fontsize", "12"), ("fontcolor", COLORS["text"])]
        ).join(["node ", ";"]),
        "  "
        + attr_list([("fontname", "Helvetica"), ("fontsize", "10"), ("arrowsize", "0.8")]).join(
            ["edge ", ";"]
        ),
    ]


def render_dot(spec: MachineSpec) -> str:
    """The machine as a Graphviz digraph, byte-for-byte the same for the same spec.

    It has no legend of its own: `render_legend_dot` draws the one legend of every diagram.
    """
    lines = [
        f"// Generated by `{COMMAND}` from the `{spec.name}` machine in spec/. Never edit by hand.",
        f"digraph {quote(spec.name)} {{",
        graph_attrs(
            f"{spec.title}: lifecycle of one {spec.name} record",
            f"key: {LEGEND_NAME}.svg; every crash point: README.md",
        ),
        *default_attrs(),
        "",
        "  // The initial state: a point with an arrow into it.",
        f"  {quote('__initial')} {attr_list(INITIAL_POINT)};",
        f"  {quote('__initial')} -> {quote(spec.initial.name)};",
        "",
        "  // States, in declaration order (terminal ones after the junctions).",
    ]
    states = [
        f"  {quote(s.name)} {attr_list([('label', _state_label(s)), *_state_style(s)])};"
        for s in spec.states
    ]
    lines.extend(line for s, line in zip(spec.states, states, strict=True) if not s.terminal)
    # A transition from several states meets at a junction. Declared between the live states
    # and the terminal ones, and weighted to sit level with its destination, the junctions
    # keep their lines clear of the other labels.
    several = [(i, t) for i, t in enumerate(spec.transitions) if len(t.source) > 1]
    if several:
        lines.extend(["", "  // Transitions from several states, each through a junction."])
        for index, t in several:
            lines.extend(_dot_transition(index, t))
        lines.append("")
    lines.extend(line for s, line in zip(spec.states, states, strict=True) if s.terminal)
    terminals = [s.name for s in spec.states if s.terminal]
    if terminals:
        lines.append("  {rank=max; " + " ".join(quote(n) for n in terminals) + ";}")
    lines.extend(["", "  // Transitions from one state, in declaration order."])
    for index, t in enumerate(spec.transitions):
        if len(t.source) == 1:
            lines.extend(_dot_transition(index, t))
    lines.extend(["}", ""])
    return "\n".join(lines)
