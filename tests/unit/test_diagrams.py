"""The lifecycle diagrams as files: generated deterministically from the spec, and never
drifting (the CI drift check, drift detection, the README, the SVGs).

How the diagrams draw the spec (DOT and Mermaid encodings, the legend, labels, crash
labels) is tests/unit/test_diagrams_rendering.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import lockgate.spec as spec
from lockgate.spec import diagrams
from lockgate.spec.model import MachineSpec, TransitionSpec
from tests.support.diagram_trees import COMMITTED
from tests.support.diagram_trees import build_tree as _build_tree
from tests.support.diagram_trees import fake_svg as _fake_svg
from tests.support.programs import require

FIX = "lockgate diagrams"

@pytest.fixture(name="dot_installed")
def dot_installed_fixture() -> None:
    require("dot", "graphviz")  # skips, naming the package (on CI, fails)


needs_dot = pytest.mark.usefixtures("dot_installed")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return _build_tree(tmp_path / "diagrams")


# --- the CI drift check -------------------------------------------------------------------


def test_committed_diagrams_match_the_spec() -> None:
    problems = diagrams.drift(COMMITTED)
    assert not problems, (
        "diagrams/ is out of date with spec/; run `lockgate diagrams` to regenerate it "
        "(and commit the result):\n" + "\n".join(problems)
    )


def test_drift_empty_for_a_copy_of_the_committed_tree(tmp_path: Path) -> None:
    copy = tmp_path / "diagrams"
    shutil.copytree(COMMITTED, copy)
    assert diagrams.drift(copy) == []


# --- determinism --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(spec.MACHINES))
def test_text_renderings_are_deterministic(name: str) -> None:
    machine = spec.MACHINES[name]
    assert diagrams.render_dot(machine) == diagrams.render_dot(machine)
    assert diagrams.render_mermaid(machine) == diagrams.render_mermaid(machine)
    # A rebuilt (equal) spec renders the same bytes: nothing depends on object identity.
    clone = MachineSpec.model_validate(machine.model_dump())
    assert diagrams.render_dot(clone) == diagrams.render_dot(machine)
    first = diagrams.render_readme(spec.MACHINES, spec.COMPOSITIONS)
    assert first == diagrams.render_readme(spec.MACHINES, spec.COMPOSITIONS)


@needs_dot
def test_generate_twice_gives_the_same_bytes(tmp_path: Path) -> None:
    first = diagrams.generate(tmp_path)
    second = diagrams.generate(tmp_path)
    assert first == second
    names = sorted(p.name for p in first)
    expected = ["README.md", "legend.dot", "legend.svg"] + [
        f"{m}.{ext}" for m in spec.MACHINES for ext in ("dot", "mmd", "svg")
    ]
    assert names == sorted(expected)


@needs_dot
def test_write_then_drift_is_clean(tmp_path: Path) -> None:
    out = tmp_path / "diagrams"
    written = diagrams.write(out)
    assert written == sorted(written)
    assert set(written) == {p for p in out.iterdir()}
    assert diagrams.drift(out) == []


# --- drift detection ----------------------------------------------------------------------


def test_drift_is_empty_for_a_fresh_tree(tree: Path) -> None:
    assert diagrams.drift(tree) == []


def test_drift_reports_an_edited_mermaid_file(tree: Path) -> None:
    mmd = tree / "execution.mmd"
    mmd.write_text(mmd.read_text(encoding="utf-8") + "    note right of pending: hand-edit\n")
    problems = diagrams.drift(tree)
    assert len(problems) == 1
    assert str(mmd) in problems[0]
    assert FIX in problems[0]
    assert "hand-edit" in problems[0]  # the message shows what differs


def test_drift_reports_a_missing_file(tree: Path) -> None:
    (tree / "session.dot").unlink()
    problems = diagrams.drift(tree)
    assert len(problems) == 1
    assert "session.dot" in problems[0] and "missing" in problems[0]
    assert FIX in problems[0]


def test_drift_reports_an_extra_file(tree: Path) -> None:
    (tree / "scratch.dot").write_text("digraph {}\n")
    problems = diagrams.drift(tree)
    assert len(problems) == 1
    assert "scratch.dot" in problems[0] and FIX in problems[0]


def test_drift_reports_a_stale_or_unstamped_svg(tree: Path) -> None:
    (tree / "instance.svg").write_bytes(_fake_svg("digraph old {}"))
    (tree / "session.svg").write_bytes(b"<svg/>")
    problems = diagrams.drift(tree)
    assert len(problems) == 2
    stale = next(p for p in problems if "instance.svg" in p)
    unstamped = next(p for p in problems if "session.svg" in p)
    assert "stale" in stale and FIX in stale
    assert "stamp" in unstamped and FIX in unstamped


def test_drift_reports_a_spec_change(tree: Path) -> None:
    new = TransitionSpec(
        event="nudge",
        source=(spec.ExecutionStatus.PENDING,),
        dest=spec.ExecutionStatus.PENDING,
        description="A transition the committed diagrams do not know about.",
    )
    changed = spec.EXECUTION.model_copy(update={"transitions": (*spec.EXECUTION.transitions, new)})
    machines = {**spec.MACHINES, "execution": changed}
    assert "nudge" in diagrams.render_dot(changed)
    assert "nudge" in diagrams.render_mermaid(changed)
    problems = diagrams.drift(tree, machines=machines)
    flagged = sorted(Path(p.split(":")[0]).name for p in problems)
    assert flagged == ["README.md", "execution.dot", "execution.mmd", "execution.svg"]
    assert all(FIX in p for p in problems)


def test_drift_reports_files_of_a_removed_machine(tree: Path) -> None:
    machines = {k: v for k, v in spec.MACHINES.items() if k != "instance"}
    problems = diagrams.drift(tree, machines=machines)
    flagged = sorted(Path(p.split(":")[0]).name for p in problems)
    assert flagged == ["README.md", "instance.dot", "instance.mmd", "instance.svg"]
    assert all(FIX in p for p in problems)


def test_drift_of_a_missing_folder_names_every_file(tmp_path: Path) -> None:
    problems = diagrams.drift(tmp_path / "nowhere")
    assert len(problems) == 3 * len(spec.MACHINES) + 3  # and the README and the legend's two
    assert all("missing" in p and FIX in p for p in problems)


def test_write_prunes_stale_generated_files_only_in_its_own_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(diagrams, "render_svg", _fake_svg)
    out = _build_tree(tmp_path / "diagrams")
    (out / "gone_machine.dot").write_text("digraph {}\n")
    (out / "notes.txt").write_text("kept\n")
    diagrams.write(out)
    assert not (out / "gone_machine.dot").exists()
    assert (out / "notes.txt").exists()  # not a generated kind of file: reported, not deleted
    assert [p for p in diagrams.drift(out) if "notes.txt" in p]

    foreign = tmp_path / "elsewhere"
    foreign.mkdir()
    (foreign / "unrelated.md").write_text("mine\n")
    diagrams.write(foreign)
    assert (foreign / "unrelated.md").exists()  # no generated README there: nothing pruned


# --- the README ---------------------------------------------------------------------------


def test_readme_embeds_a_mermaid_block_for_every_machine() -> None:
    readme = diagrams.render_readme(spec.MACHINES, spec.COMPOSITIONS)
    assert readme.count("```mermaid\n") == len(spec.MACHINES)
    for machine in spec.MACHINES.values():
        assert f"```mermaid\n{diagrams.render_mermaid(machine)}```" in readme
        assert f"## {machine.title}\n" in readme
        assert f"]({machine.name}.svg)" in readme
        for state in machine.states:
            assert f"| `{state.name}` |" in readme
        for t in machine.transitions:
            assert f"| `{t.event}` |" in readme


def test_readme_says_it_is_generated_and_how_to_regenerate() -> None:
    readme = diagrams.render_readme(spec.MACHINES, spec.COMPOSITIONS)
    head = readme[:600]
    assert "never hand-edited" in head.lower()
    assert "`lockgate diagrams`" in head
    for comp in spec.COMPOSITIONS.values():
        for step in comp.joint_steps:
            assert f"| `{step.name}` |" in readme


def test_committed_readme_embeds_every_machine() -> None:
    readme = (COMMITTED / "README.md").read_text(encoding="utf-8")
    for machine in spec.MACHINES.values():
        assert f"```mermaid\n{diagrams.render_mermaid(machine)}```" in readme


# --- SVG ----------------------------------------------------------------------------------


@needs_dot
def test_svg_is_deterministic_and_stamped_with_its_dot_hash() -> None:
    dot = diagrams.render_dot(spec.EXECUTION)
    first = diagrams.render_svg(dot)
    assert first == diagrams.render_svg(dot)
    assert first.startswith(b"<?xml")
    assert b"<svg" in first
    assert diagrams.svg_stamp(first) == diagrams.dot_digest(dot)
    for state in spec.EXECUTION.states:
        assert state.name.encode() in first


def test_render_svg_without_graphviz_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(diagrams.GraphvizMissing, match="apt-get install graphviz"):
        diagrams.render_svg("digraph {}")
