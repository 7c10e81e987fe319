"""What describes a tool source's table, without the source kinds themselves
(`machine.tools.kinds`): where a table came from, and the auth forms it may use."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Origin:
    """Where a source's table came from, for messages (`label`), the directory its file
    names are relative to (None where files may not be named: a request's source, a stored
    one), and whether it may name a command to run on the server (an operator's may)."""

    label: str
    directory: Path | None
    commands: bool = True

    def __str__(self) -> str:
        return self.label


#: Where a request's source table comes from (agent code's `tools.lockgate.add_*_source`):
#: no file on the server may be named.
REQUEST = Origin("the request", None, commands=False)

AUTH_FORMS = (
    '{ bearer = "<secret>" }, { basic = "<secret>" }, { header = "<name>", secret = "<secret>" }'
    ', { query = "<name>", secret = "<secret>" } or { oauth_token_url = "<url>", secret = '
    '"<secret>", scope = "<scope>" } (scope optional)'
)
