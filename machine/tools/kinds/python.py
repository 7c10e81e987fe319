"""`[[python]]`: the operator's own tools, made by a factory (`machine.tools.plugins`). Only
the sources file gives one (it imports code on the server): never stored, never added by
agent code."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lockgate.machine.tools.errors import InvalidToolSource
from lockgate.machine.tools.plugins import factory_source
from lockgate.machine.tools.source_kind import SourceKind
from lockgate.machine.tools.source_tables import Origin
from lockgate.machine.tools.spec import ToolSource

if TYPE_CHECKING:
    from lockgate.machine.secrets import SecretStore
    from lockgate.machine.tools.http_calls import HttpLimits

KEYS = ("factory", "options")


def build(
    entry: Mapping[str, Any], origin: Origin, limits: HttpLimits, secrets: SecretStore | None
) -> ToolSource:
    extra = sorted(set(entry) - set(KEYS))
    if extra:
        raise InvalidToolSource(
            f"{origin}: unknown keys {', '.join(extra)}",
            hint="A [[python]] source has factory and options.",
        )
    factory, options = entry.get("factory"), entry.get("options", {})
    if not isinstance(factory, str):
        raise InvalidToolSource(f'{origin} has no factory ("module:callable")')
    if not isinstance(options, Mapping):
        raise InvalidToolSource(f"{origin}: options must be a table")
    return factory_source(factory, options, str(origin))


PYTHON = SourceKind(
    name="python",
    keys=KEYS,
    about="your own tools, made by a Python factory",
    build=build,
    named=False,
)
