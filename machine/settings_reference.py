"""The reference table of every setting (docs/configuration.md), generated from `Settings`."""

from __future__ import annotations

from datetime import timedelta

from lockgate.machine.settings import Settings


def reference_table() -> str:
    """The Markdown reference of every setting, generated from this model (docs/configuration.md
    embeds it)."""
    rows = ["| environment variable | default | what it does |", "|---|---|---|"]
    # The main model's own settings first, then those of its parts (webhooks, approvers).
    own = set(Settings.__annotations__)
    ordered = sorted(Settings.model_fields.items(), key=lambda item: item[0] not in own)
    for name, field in ordered:
        variable = "DATABASE_URL" if name == "database_url" else f"LOCKGATE_{name.upper()}"
        default = field.default
        extra = field.json_schema_extra
        if isinstance(extra, dict) and "shown_default" in extra:  # one made when read
            shown = f"`{extra['shown_default']}`"
        elif isinstance(default, timedelta):
            shown = f"{int(default.total_seconds())} s"
        elif default in (None, ""):
            shown = "(unset)"
        else:
            shown = f"`{default}`"
        rows.append(f"| `{variable}` | {shown} | {field.description} |")
    return "\n".join(rows) + "\n"
