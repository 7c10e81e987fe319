"""Your own Python tools: sources written against the registry's interface (`ToolSource`:
a `name` and `tools()`, each tool a `ToolSpec` and `call`), the interface the built-in
sources use, added without changing Lockgate.

Two ways in, both read at start-up:

- the entry point group `lockgate.sources` of any installed package: each entry point names
  a callable that takes no argument and returns the source;
- a `[[python]]` table of the sources file: `factory = "module:callable"`, called with the
  keyword arguments of its optional `options` table.

A factory that fails, or returns something that is not a source, stops the server with a
message naming it, rather than leaving its tools silently missing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

from lockgate.machine.tools.errors import InvalidToolSource
from lockgate.machine.tools.spec import ToolSource

ENTRY_POINT_GROUP = "lockgate.sources"


def installed_sources() -> list[ToolSource]:
    """One source per entry point of the `lockgate.sources` group, in name order."""
    made: list[ToolSource] = []
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        where = f"entry point {point.name!r} ({point.value})"
        try:
            factory = point.load()
        except Exception as exc:
            raise InvalidToolSource(
                f"the {where} cannot be loaded ({type(exc).__name__}: {exc})"
            ) from None
        made.append(_call(factory, {}, where))
    return made


def factory_source(factory: str, options: Mapping[str, Any], where: str) -> ToolSource:
    """The source `module:callable` makes with `options` (a `[[python]]` table)."""
    module_name, _, attribute = factory.partition(":")
    if not module_name or not attribute:
        raise InvalidToolSource(
            f"{where}: factory {factory!r} is not 'module:callable'",
            hint='For example factory = "my_tools:make_source".',
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidToolSource(
            f"{where}: module {module_name!r} cannot be imported ({exc})",
            hint="Install it in the server's environment, or put it on PYTHONPATH.",
        ) from None
    made = getattr(module, attribute, None)
    if not callable(made):
        raise InvalidToolSource(f"{where}: {factory!r} is not a callable of {module_name!r}")
    return _call(made, options, where)


def _call(factory: Callable[..., Any], options: Mapping[str, Any], where: str) -> ToolSource:
    try:
        source = factory(**options)
    except Exception as exc:
        raise InvalidToolSource(
            f"{where}: making the source failed ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(getattr(source, "name", None), str) or not callable(
        getattr(source, "tools", None)
    ):
        raise InvalidToolSource(
            f"{where}: it returned {type(source).__name__}, not a tool source",
            hint="Return an object with a `name` and a `tools()` method "
            "(lockgate.machine.tools.ToolSource).",
        )
    # Checked by structure above: the Protocol is not runtime-checkable.
    checked: ToolSource = source
    return checked
