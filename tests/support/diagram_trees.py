"""The diagrams folder as the diagram tests see it: the committed one (`COMMITTED`), and one
laid out by hand from a spec (`build_tree`) with stand-in SVGs (`fake_svg`), so that no
Graphviz is needed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import lockgate.spec as spec
from lockgate.spec import diagrams
from lockgate.spec.model import MachineSpec

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "diagrams"


def fake_svg(dot_text: str) -> bytes:
    """An SVG stamped as if rendered from `dot_text` (drift checks the stamp, not the art)."""
    return (
        b'<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n'
        + f"<!-- lockgate-dot-sha256: {diagrams.dot_digest(dot_text)} -->\n".encode()
        + b'<svg xmlns="http://www.w3.org/2000/svg"/>\n'
    )


def build_tree(out: Path, machines: Mapping[str, MachineSpec] = spec.MACHINES) -> Path:
    """The folder the spec generates, laid out by hand (so the layout itself is checked),
    with stand-in SVGs so that no Graphviz is needed."""
    out.mkdir(parents=True, exist_ok=True)
    legend = diagrams.render_legend_dot()
    (out / "legend.dot").write_text(legend, encoding="utf-8")
    (out / "legend.svg").write_bytes(fake_svg(legend))
    for name, machine in machines.items():
        dot = diagrams.render_dot(machine)
        (out / f"{name}.dot").write_text(dot, encoding="utf-8")
        (out / f"{name}.mmd").write_text(diagrams.render_mermaid(machine), encoding="utf-8")
        (out / f"{name}.svg").write_bytes(fake_svg(dot))
    readme = diagrams.render_readme(machines, spec.COMPOSITIONS)
    (out / "README.md").write_text(readme, encoding="utf-8")
    return out
