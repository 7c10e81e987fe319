"""Lifecycle diagrams generated from the spec, deterministically: the folder as a whole.

Every file under `diagrams/` comes from the spec through this module and nowhere else: a
Graphviz DOT file, its SVG and a Mermaid `stateDiagram-v2` per machine, one legend
(`legend.dot` and its SVG) for them all, and a README that shows the legend, embeds the
Mermaid diagrams and tabulates every state, transition and crash point. `write` regenerates
them (the `lockgate diagrams` command), `drift` says how the committed files differ from what
the spec generates now (the CI check).

Determinism: everything is built by hand from the spec in declaration order, with no
timestamps, versions or dictionary-order accidents, so the same spec gives the same bytes.

The drawing is done by modules with one job each, whose public names are re-exported here so
that callers need only this one:

- `spec.diagram_style`: the symbols, colours and wording every drawing shares, and the rules
  of what an edge is labelled with (`crash_label`) and how a transition from several states
  is drawn (`merge_id`);
- `spec.diagram_dot`: the Graphviz drawing of one machine;
- `spec.diagram_mermaid`: the Mermaid drawing of one machine;
- `spec.diagram_legend`: the one legend, as a drawing and as the README's key;
- `spec.diagram_svg`: rendering DOT to SVG with Graphviz, and why an SVG is checked by the
  hash of its DOT source rather than byte for byte;
- `spec.diagram_readme`, `spec.diagram_lifecycle`, `spec.diagram_composition` and
  `spec.diagram_markdown`: the README, a machine's section, a composition's section, and the
  Markdown they are written in.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lockgate.spec import COMPOSITIONS, MACHINES
from lockgate.spec.diagram_dot import edge_label_lines, render_dot
from lockgate.spec.diagram_legend import CRASH_LABEL_RULE, LEGEND, render_legend_dot
from lockgate.spec.diagram_mermaid import mermaid_label, render_mermaid
from lockgate.spec.diagram_readme import README_MARKER, render_readme
from lockgate.spec.diagram_style import (
    APPROVAL,
    COLORS,
    COMMAND,
    CRASH,
    EXTERNAL,
    LEGEND_NAME,
    MERGE,
    ORDINARY_PHASES,
    PHASE_ABBREVIATIONS,
    RECOVERY,
    crash_label,
    crash_marker,
    crash_points_notable,
    crash_summary,
    guard_text,
    merge_id,
    state_kind,
    state_kinds,
    timing_text,
)
from lockgate.spec.diagram_svg import GraphvizMissing, dot_digest, render_svg, svg_stamp
from lockgate.spec.model import Composition, MachineSpec

__all__ = [
    "APPROVAL",
    "COLORS",
    "COMMAND",
    "CRASH",
    "CRASH_LABEL_RULE",
    "DEFAULT_DIR",
    "EXTERNAL",
    "FIX",
    "GENERATED_SUFFIXES",
    "LEGEND",
    "LEGEND_NAME",
    "MERGE",
    "ORDINARY_PHASES",
    "PHASE_ABBREVIATIONS",
    "README_MARKER",
    "RECOVERY",
    "GraphvizMissing",
    "crash_label",
    "crash_marker",
    "crash_points_notable",
    "crash_summary",
    "dot_digest",
    "drift",
    "edge_label_lines",
    "generate",
    "guard_text",
    "merge_id",
    "mermaid_label",
    "render_dot",
    "render_legend_dot",
    "render_mermaid",
    "render_readme",
    "render_svg",
    "state_kind",
    "state_kinds",
    "svg_stamp",
    "timing_text",
    "write",
]

#: What every drift message tells the reader to do.
FIX = f"run `{COMMAND}` to regenerate"

#: Where the generated files live in the repository.
DEFAULT_DIR = Path(__file__).resolve().parent.parent / "diagrams"

#: Suffixes of the files this module generates (`write` may prune stale ones of these).
GENERATED_SUFFIXES = frozenset({".dot", ".svg", ".mmd", ".md"})


@dataclass(frozen=True)
class _Plan:
    """What the spec generates: exact text files, and for each SVG the DOT it renders."""

    texts: Mapping[Path, bytes]
    svgs: Mapping[Path, str]


def _plan(
    out_dir: Path,
    machines: Mapping[str, MachineSpec] | None,
    compositions: Mapping[str, Composition] | None,
) -> _Plan:
    chosen = MACHINES if machines is None else machines
    comps = COMPOSITIONS if compositions is None else compositions
    if LEGEND_NAME in chosen:
        raise ValueError(f"a machine may not be named {LEGEND_NAME!r}: the legend's files are")
    legend = render_legend_dot()
    texts: dict[Path, bytes] = {out_dir / f"{LEGEND_NAME}.dot": legend.encode("utf-8")}
    svgs: dict[Path, str] = {out_dir / f"{LEGEND_NAME}.svg": legend}
    for name, spec in chosen.items():
        dot = render_dot(spec)
        texts[out_dir / f"{name}.dot"] = dot.encode("utf-8")
        texts[out_dir / f"{name}.mmd"] = render_mermaid(spec).encode("utf-8")
        svgs[out_dir / f"{name}.svg"] = dot
    texts[out_dir / "README.md"] = render_readme(chosen, comps).encode("utf-8")
    return _Plan(texts, svgs)


def generate(
    out_dir: Path,
    *,
    machines: Mapping[str, MachineSpec] | None = None,
    compositions: Mapping[str, Composition] | None = None,
) -> dict[Path, bytes]:
    """Every file of the diagrams folder, path (under `out_dir`) -> bytes, in a fixed order.

    `machines` and `compositions` default to the spec's; passing others is for tests.
    Rendering the SVGs needs Graphviz (`GraphvizMissing` otherwise).
    """
    plan = _plan(out_dir, machines, compositions)
    files = dict(plan.texts)
    for path, dot in plan.svgs.items():
        files[path] = render_svg(dot)
    return dict(sorted(files.items()))


def _is_generated_dir(out_dir: Path) -> bool:
    readme = out_dir / "README.md"
    try:
        with readme.open("rb") as f:
            return f.readline().decode("utf-8", "replace").strip() == README_MARKER
    except OSError:
        return False


def write(out_dir: Path) -> list[Path]:
    """Regenerate the folder; return the files written, sorted.

    Stale generated files (of a machine no longer in the spec) are removed, but only from a
    folder whose README this module wrote, so pointing it at the wrong folder deletes nothing.
    """
    files = generate(out_dir)  # everything rendered before anything is written
    out_dir.mkdir(parents=True, exist_ok=True)
    if _is_generated_dir(out_dir):
        for path in sorted(out_dir.iterdir()):
            if path.is_file() and path.suffix in GENERATED_SUFFIXES and path not in files:
                path.unlink()
    for path, data in files.items():
        path.write_bytes(data)
    return sorted(files)


def _first_difference(path: Path, expected: bytes, actual: bytes) -> str:
    want = expected.decode("utf-8", "replace").splitlines()
    have = actual.decode("utf-8", "replace").splitlines()
    diff = list(difflib.unified_diff(have, want, "committed", "generated", n=0, lineterm=""))
    shown = [line for line in diff[2:] if not line.startswith("@@")][:6]
    detail = "\n".join(f"    {line}" for line in shown)
    more = "\n    ..." if len(diff) - 2 > len(shown) else ""
    return (
        f"{path}: differs from what the spec generates; {FIX}\n{detail}{more}"
        if shown
        else f"{path}: differs from what the spec generates (whitespace or encoding); {FIX}"
    )


def drift(
    out_dir: Path,
    *,
    machines: Mapping[str, MachineSpec] | None = None,
    compositions: Mapping[str, Composition] | None = None,
) -> list[str]:
    """How `out_dir` differs from what the spec generates; empty when it is up to date.

    DOT, Mermaid and README files are compared byte for byte; an SVG must exist and carry the
    hash of the DOT text the spec generates now. Needs no Graphviz.
    """
    plan = _plan(out_dir, machines, compositions)
    problems: list[str] = []
    expected = sorted([*plan.texts, *plan.svgs])
    for path in expected:
        if not path.is_file():
            problems.append(f"{path}: missing; {FIX}")
            continue
        actual = path.read_bytes()
        if path in plan.texts:
            if actual != plan.texts[path]:
                problems.append(_first_difference(path, plan.texts[path], actual))
            continue
        stamp = svg_stamp(actual)
        if stamp is None:
            problems.append(
                f"{path}: has no `lockgate-dot-sha256` stamp, so it was not made by "
                f"`{COMMAND}`; {FIX}"
            )
        elif stamp != dot_digest(plan.svgs[path]):
            problems.append(
                f"{path}: stale, rendered from a different DOT source than the spec generates "
                f"now; {FIX}"
            )
    if out_dir.is_dir():
        wanted = set(expected)
        for path in sorted(p for p in out_dir.rglob("*") if p.is_file()):
            if path not in wanted:
                problems.append(
                    f"{path}: not generated from the spec (a machine removed or renamed, or a "
                    f"stray file); {FIX}, which removes stale generated files, or delete it"
                )
    return problems
