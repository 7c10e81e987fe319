"""The settings of what the database keeps: each principal's budget of stored bytes, and how
long finished executions are kept before they are purged.

A part of `Settings` (`machine/settings.py`, which inherits these), kept apart so each file
holds one concern; the variables are read the same way (`LOCKGATE_` prefix).
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings


class StorageSettings(BaseSettings):
    max_stored_bytes_per_principal: int = Field(
        default=1024**3,
        ge=1024,
        description="Bytes one principal's executions may keep in the database: their code, "
        "every call's arguments and result, and a finished execution's result, logs and "
        "snapshot. At it, execute is refused with `limit_reached`, and a running execution's "
        "next call fails in its code, until the retention period purges older executions.",
    )
    finished_retention: timedelta = Field(
        default=timedelta(days=30),
        description="How long a finished execution (with its journal of calls, their "
        "decisions and its transitions) is kept; older ones are purged, a bounded number "
        "each maintenance round. Export the audit trail before, if it must be kept longer.",
    )

    @field_validator("finished_retention")
    @classmethod
    def _at_least_a_second(cls, value: timedelta) -> timedelta:
        if value < timedelta(seconds=1):
            raise ValueError("must be at least 1 second")
        return value
