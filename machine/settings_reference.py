"""Settings as their users name them, environment variables: the reference table of every
setting (docs/configuration.md), generated from `Settings`, and what is wrong with a
configuration that does not validate."""

from __future__ import annotations

from datetime import timedelta

from pydantic import ValidationError

from lockgate.machine.settings import Settings


def variable_of(field: str) -> str:
    """The environment variable that sets the field `field`."""
    return "DATABASE_URL" if field == "database_url" else f"LOCKGATE_{field.upper()}"


def invalid_configuration(exc: ValidationError) -> str:
    """What is wrong with the configuration, each error after the variable it concerns; never
    a value (a secret may be among them)."""
    problems = []
    for error in exc.errors():
        message = str(error["msg"]).removeprefix("Value error, ")
        location = error["loc"]
        if not location:  # a check across settings: its message names them
            problems.append(message)
            continue
        field = str(location[0])
        variable = variable_of(field) if field in Settings.model_fields else field
        problems.append(f"{variable}: {message}")
    return (
        f"invalid configuration: {'; '.join(problems)}. Correct the environment (or .env) and "
        "run the command again (`lockgate settings` lists every setting)."
    )


def reference_table() -> str:
    """The Markdown reference of every setting, generated from this model (docs/configuration.md
    embeds it)."""
    rows = ["| environment variable | default | what it does |", "|---|---|---|"]
    # The main model's own settings first, then those of its parts (webhooks, approvers).
    own = set(Settings.__annotations__)
    ordered = sorted(Settings.model_fields.items(), key=lambda item: item[0] not in own)
    for name, field in ordered:
        variable = variable_of(name)
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
