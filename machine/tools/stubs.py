"""The `.pyi` text of agent code's `tools` package: one module per source, and the package.

Given to Monty as the `stubs` of each `ExternalModule`, they let it type-check agent code;
as one text (`package_text`) they document the tools. Each tool's own `def` is
`ToolSpec.stub`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from lockgate.machine.tools.spec import NAMESPACE, ToolSpec

_BUILTIN_ANNOTATIONS = ("str", "int", "float", "bool", "list", "dict")


def package_stub(sources: Iterable[str]) -> str:
    """The `tools` package's own `.pyi` (Monty: the `stubs` of the outer `ExternalModule`).

    Re-exporting each source lets `import tools` then `tools.notes.write(...)` type-check;
    without it the checker asks for `import tools.notes`.
    """
    lines = [f'"""Tools: call as {NAMESPACE}.<source>.<name>(keyword=...)."""', ""]
    lines += [f"from . import {name} as {name}" for name in sorted(sources)]
    return "\n".join(lines) + "\n"


def module_stub(source: str, specs: Iterable[ToolSpec]) -> str:
    """The module `tools.<source>`, its tools in name order."""
    ordered = sorted(specs, key=lambda s: s.name)
    # A tool named like a builtin (notes.list) hides it for the module's annotations.
    shadowed = tuple(n for n in _BUILTIN_ANNOTATIONS if any(s.name == n for s in ordered))
    header = f'"""{NAMESPACE}.{source}: call with keyword arguments only."""\n\n'
    if shadowed:
        header += "import builtins\n"
    header += "from typing import Any\n\n"
    return header + "\n\n".join(spec.stub(shadowed) for spec in ordered) + "\n"


def package_text(sources: Mapping[str, Sequence[ToolSpec]]) -> str:
    """The whole package as one text for documentation: `__init__.pyi`, then each module."""
    parts = [f"# ---- {NAMESPACE}/__init__.pyi ----\n{package_stub(sources)}"]
    parts += [
        f"# ---- {NAMESPACE}/{name}.pyi ----\n{module_stub(name, sources[name])}"
        for name in sorted(sources)
    ]
    return "\n".join(parts)
