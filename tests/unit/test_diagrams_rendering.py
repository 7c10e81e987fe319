"""How the lifecycle diagrams draw the spec: the DOT encodings, the one legend, each
transition labelled once, crash labels where the rule says, and the Mermaid text.

The generated files and the drift check are tests/unit/test_diagrams.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import lockgate.spec as spec
from lockgate.spec import diagrams
from lockgate.spec.model import (
    EffectTiming,
    ExternalEffect,
    MachineSpec,
    TransitionKind,
    TransitionSpec,
)
from tests.support.diagram_trees import COMMITTED
from tests.support.diagram_trees import build_tree as _build_tree


def _recovery_transition(machine: MachineSpec) -> TransitionSpec:
    found = [t for t in machine.transitions if t.kind is TransitionKind.RECOVERY]
    assert found, f"{machine.name} has no recovery transition to check"
    return found[0]


def _node_line(dot: str, name: str) -> str:
    lines = [line for line in dot.splitlines() if line.strip().startswith(f'"{name}" [')]
    assert len(lines) == 1, f"expected one node statement for {name!r}, got {lines}"
    return lines[0]


def _edge_lines(dot: str, source: str, dest: str) -> list[str]:
    return [line for line in dot.splitlines() if line.strip().startswith(f'"{source}" -> "{dest}"')]


_DOT_LABEL = re.compile(r'label="((?:[^"\\]|\\.)*)"')


def _dot_edge_labels(dot: str) -> list[str]:
    """The label of every edge statement of a DOT text, lines joined by `\\n` as written."""
    labels = []
    for line in dot.splitlines():
        if " -> " in line:
            found = _DOT_LABEL.search(line)
            labels.append(found.group(1) if found else "")
    return labels


def _dot_label(t: TransitionSpec) -> str:
    """The label of `t`'s edge as the DOT text spells it."""
    lines = diagrams.edge_label_lines(t)
    return "\\n".join(line.replace("\\", "\\\\").replace('"', '\\"') for line in lines)


def _mermaid_labels(text: str) -> list[str]:
    return [line.split(": ", 1)[1] for line in text.splitlines() if "--> " in line and ": " in line]


def _several_sources() -> list[tuple[MachineSpec, int, TransitionSpec]]:
    found = [
        (machine, index, t)
        for machine in spec.MACHINES.values()
        for index, t in enumerate(machine.transitions)
        if len(t.source) > 1
    ]
    assert found, "the spec has no transition from several states to check"
    return found


def _crash_points_labelled(t: TransitionSpec) -> bool:
    """The rule the README states: an edge shows its crash points only when they are not just
    the `bc ac` of every durable write, i.e. it has an external effect or is not durable."""
    return t.external_effect is not None or not t.durable


def _readme_section(readme: str, title: str) -> str:
    start = readme.index(f"\n## {title}\n")
    end = readme.find("\n## ", start + 1)
    return readme[start : end if end != -1 else len(readme)]


# --- DOT encodings ------------------------------------------------------------------------


def test_dot_marks_terminal_states_and_recovery_edges() -> None:
    machine = spec.EXECUTION
    dot = diagrams.render_dot(machine)
    terminal = next(s for s in machine.states if s.terminal)
    line = _node_line(dot, terminal.name)
    assert 'peripheries="2"' in line
    assert 'style="rounded,filled,bold"' in line
    assert f'fillcolor="{diagrams.COLORS["terminal_fill"]}"' in line

    recovery = _recovery_transition(machine)
    for source in recovery.source:
        # (a normal transition may join the same two states: `hand_back` does requeue's)
        (edge,) = [e for e in _edge_lines(dot, source, recovery.dest) if f" {recovery.event}" in e]
        assert f'label="\u26a1 {recovery.event}' in edge
        assert "dashed" in edge
        assert f'color="{diagrams.COLORS["recovery"]}"' in edge

    normal = next(t for t in machine.transitions if t.kind is TransitionKind.NORMAL)
    edge = _edge_lines(dot, normal.source[0], normal.dest)[0]
    assert 'style="solid"' in edge and "\u26a1" not in edge


def test_dot_distinguishes_owned_states_from_durable_waits() -> None:
    for machine in spec.MACHINES.values():
        dot = diagrams.render_dot(machine)
        for state in machine.states:
            line = _node_line(dot, state.name)
            kind = diagrams.state_kind(state)
            fill = {
                "owned": diagrams.COLORS["owned_fill"],
                "durable wait": diagrams.COLORS["wait_fill"],
                "terminal": diagrams.COLORS["terminal_fill"],
            }[kind]
            assert f'fillcolor="{fill}"' in line, (machine.name, state.name)


def test_dot_marks_the_initial_state() -> None:
    dot = diagrams.render_dot(spec.EXECUTION)
    assert '"__initial" [shape="point"' in dot
    assert f'"__initial" -> "{spec.EXECUTION.initial.name}";' in dot
    assert "timestamp" not in dot.lower()


def test_dot_draws_every_transition_once() -> None:
    """One labelled edge per transition; one from several states through a junction."""
    for machine in spec.MACHINES.values():
        dot = diagrams.render_dot(machine)
        states = [line for line in dot.splitlines() if " -> " in line and "__initial" not in line]
        assert len(states) == sum(
            1 if len(t.source) == 1 else len(t.source) + 1 for t in machine.transitions
        )
        for index, t in enumerate(machine.transitions):
            label = f'label="{_dot_label(t)}"'
            if len(t.source) == 1:
                (edge,) = [e for e in _edge_lines(dot, t.source[0], t.dest) if label in e]
            else:
                junction = f"__{diagrams.merge_id(index, t)}"
                assert 'shape="diamond"' in _node_line(dot, junction)
                for source in t.source:
                    (line,) = _edge_lines(dot, source, junction)
                    assert "label=" not in line and 'arrowhead="none"' in line
                    assert not [e for e in _edge_lines(dot, source, t.dest) if label in e]
                (edge,) = _edge_lines(dot, junction, t.dest)
                assert label in edge
            if t.external_effect is not None:
                assert f"\u2197 {t.external_effect.name}" in edge
            if t.consumes_approval:
                assert "\u2714 consumes approval" in edge


# --- the rules of the review: one legend, labels once, crash labels where notable ----------


def test_the_legend_is_one_file_the_readme_shows_once(tmp_path: Path) -> None:
    readme = diagrams.render_readme(spec.MACHINES, spec.COMPOSITIONS)
    assert readme.count("](legend.svg)") == 1
    assert readme.count("## How to read the diagrams") == 1
    assert readme.count("](legend.dot)") == 1
    legend = diagrams.render_legend_dot()
    for color in ("owned_fill", "wait_fill", "terminal_fill", "recovery", "approval"):
        assert f'"{diagrams.COLORS[color]}"' in legend, color
    assert 'shape="diamond"' in legend and 'shape="point"' in legend
    for symbol in ("\u2716", "\u26a1", "\u2197", "\u2714", "\u25c6", "[g, !h]", "/ effects"):
        assert symbol in legend, symbol
    # It is generated and checked like every other diagram.
    out = _build_tree(tmp_path / "diagrams")
    (out / "legend.svg").unlink()
    (problem,) = diagrams.drift(out)
    assert "legend.svg" in problem and "missing" in problem
    committed = (COMMITTED / "README.md").read_text(encoding="utf-8")
    assert committed.count("](legend.svg)") == 1 and (COMMITTED / "legend.svg").is_file()


@pytest.mark.parametrize("name", list(spec.MACHINES))
def test_no_machine_diagram_carries_a_legend(name: str) -> None:
    machine = spec.MACHINES[name]
    dot = diagrams.render_dot(machine)
    assert "cluster_legend" not in dot and "__legend" not in dot
    assert "Legend" not in dot
    for key_text in ("before its commit", "fired only by recovery", "a live process works"):
        assert key_text not in dot, key_text
    assert "legend.svg" in dot  # it points at the one legend instead
    mermaid = diagrams.render_mermaid(machine).lower()
    assert "legend" not in mermaid and "before its commit" not in mermaid


def test_a_transition_from_several_states_is_labelled_once() -> None:
    for machine, index, t in _several_sources():
        dot = diagrams.render_dot(machine)
        assert _dot_edge_labels(dot).count(_dot_label(t)) == 1, (machine.name, t.event)
        mermaid = diagrams.render_mermaid(machine)
        assert _mermaid_labels(mermaid).count(diagrams.mermaid_label(t)) == 1, t.event
        junction = diagrams.merge_id(index, t)
        lines = mermaid.splitlines()
        assert f"    state {junction} <<choice>>" in lines
        for source in t.source:
            assert f"    {source} --> {junction}" in lines
            assert not [line for line in lines if line.startswith(f"    {source} --> {t.dest}:")]
        assert f"    {junction} --> {t.dest}: {diagrams.mermaid_label(t)}" in lines


def test_crash_labels_only_on_the_edges_the_rule_names() -> None:
    labelled = 0
    for machine in spec.MACHINES.values():
        dot_labels = _dot_edge_labels(diagrams.render_dot(machine))
        for t in machine.transitions:
            dot_label = _dot_label(t)
            assert dot_label in dot_labels, (machine.name, t.event)
            mermaid = diagrams.mermaid_label(t)
            if _crash_points_labelled(t):
                labelled += 1
                marker = diagrams.crash_marker(t) or "\u2716 none"
                assert dot_label.endswith("\\n" + marker), (machine.name, t.event)
                assert mermaid.endswith(" " + marker), (machine.name, t.event)
            else:
                assert "\u2716" not in dot_label, (machine.name, t.event, dot_label)
                assert "\u2716" not in mermaid, (machine.name, t.event, mermaid)
    assert labelled, "no edge of the spec has notable crash points (an external effect)"
    # The rule on edges the spec does not have yet: not durable, and effect before commit.
    base = spec.EXECUTION.transitions[0]
    silent = base.model_copy(update={"event": "peek", "durable": False})
    first = base.model_copy(
        update={
            "event": "notify",
            "external_effect": ExternalEffect(
                name="send", timing=EffectTiming.BEFORE_COMMIT, description="A message."
            ),
        }
    )
    assert diagrams.edge_label_lines(silent)[-1] == "\u2716 none"
    assert diagrams.mermaid_label(silent).endswith(" \u2716 none")
    assert diagrams.edge_label_lines(first)[-1] == "\u2716 ae bc ac"
    assert diagrams.mermaid_label(first).endswith(" \u2716 ae bc ac")


def test_readme_states_the_crash_label_rule() -> None:
    readme = " ".join(diagrams.render_readme(spec.MACHINES, spec.COMPOSITIONS).split())
    rule = " ".join(diagrams.CRASH_LABEL_RULE.split())
    assert readme.count(rule) == 1
    assert "`bc`" in rule and "`ac`" in rule and "`ae`" in rule and "external effect" in rule


def test_readme_lists_every_crash_point_of_every_machine() -> None:
    readme = diagrams.render_readme(spec.MACHINES, spec.COMPOSITIONS)
    created = 0
    for machine in spec.MACHINES.values():
        section = _readme_section(readme, machine.title)
        points = spec.every_crash_point(machine)
        assert f"\n{len(points)} crash points, " in section, machine.name
        rows = [line for line in section.splitlines() if line.startswith(f"| `{machine.name}:")]
        assert len(rows) == len({p.name.rsplit(":", 1)[0] for p in points}), machine.name
        for p in points:
            edge = p.name.rsplit(":", 1)[0]
            (row,) = [r for r in rows if r.startswith(f"| `{edge}` |")]
            assert f"`{p.phase}`" in row, p.name
        creation = spec.creation_points(machine)
        created += len(creation)
        for p in creation:
            (row,) = [r for r in rows if r.startswith(f"| `{p.name.rsplit(':', 1)[0]}` |")]
            assert "| creation |" in row
        if not creation:
            assert "No creation points" in section, machine.name
        for t in machine.transitions:
            for source in t.source:
                edge = f"{machine.name}:{t.event}:{source}->{t.dest}"
                (row,) = [r for r in rows if r.startswith(f"| `{edge}` |")]
                assert row.endswith(f"| {diagrams.crash_label(t)} |"), edge
    assert created, "no machine is created alone: the creation rows went unchecked"


def test_crash_markers_follow_the_phases() -> None:
    for machine in spec.MACHINES.values():
        points = spec.crash_points(machine)
        for t in machine.transitions:
            for source in t.source:
                abbreviations = [
                    diagrams.PHASE_ABBREVIATIONS[p.phase]
                    for p in points
                    if (p.event, p.source, p.dest) == (t.event, source, t.dest)
                ]
                expected = " ".join(["\u2716", *abbreviations]) if abbreviations else ""
                assert diagrams.crash_marker(t) == expected, (machine.name, t.event)


# --- Mermaid ------------------------------------------------------------------------------

_SAFE_LABEL = re.compile("^[A-Za-z0-9 _\\[\\]!/\u26a1\u2716\u2197\u2714]+$")


@pytest.mark.parametrize("name", list(spec.MACHINES))
def test_mermaid_structure_and_safe_labels(name: str) -> None:
    machine = spec.MACHINES[name]
    text = diagrams.render_mermaid(machine)
    lines = text.splitlines()
    assert lines[0] == "stateDiagram-v2"
    assert f"    [*] --> {machine.initial.name}" in lines
    for state in machine.states:
        if state.terminal:
            assert f"    {state.name} --> [*]" in lines
    for css in ("owned", "durable_wait", "terminal"):
        assert any(line.startswith(f"    classDef {css} ") for line in lines)
    transitions = [line for line in lines if "--> " in line and "[*]" not in line]
    assert len(transitions) == sum(
        1 if len(t.source) == 1 else len(t.source) + 1 for t in machine.transitions
    )
    for label in _mermaid_labels(text):
        assert _SAFE_LABEL.match(label), label
    for t in machine.transitions:
        if t.kind is TransitionKind.RECOVERY:
            assert f"--> {t.dest}: \u26a1 {t.event}" in text


def test_mermaid_refuses_labels_it_could_misread() -> None:
    bad = spec.EXECUTION.transitions[0].model_copy(update={"effects": ("store: twice",)})
    changed = spec.EXECUTION.model_copy(update={"transitions": (bad,)})
    with pytest.raises(ValueError, match="Mermaid"):
        diagrams.render_mermaid(changed)
