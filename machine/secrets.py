"""Secrets: resolved only at dispatch, after approval, and scrubbed from everything we keep.

Nothing in this module ever puts a secret value into an error message, a `repr` or a log:
errors name the secret and where it is expected to come from, never what it is.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from pydantic import JsonValue

from lockgate.machine.errors import ErrorCode, LockgateError

REDACTED = "[REDACTED]"

# Short values would be replaced inside ordinary words and numbers, ruining output while
# protecting nothing worth protecting; real credentials are far longer.
MIN_REDACTED_LENGTH = 4


class MissingSecret(LockgateError):
    """One or more secrets a tool needs are not configured."""

    code = ErrorCode.NOT_FOUND

    def __init__(self, names: Sequence[str], *, hint: str | None = None) -> None:
        self.names = tuple(names)
        listed = ", ".join(repr(name) for name in self.names)
        noun = "secret" if len(self.names) == 1 else "secrets"
        super().__init__(
            f"{noun} {listed} not configured",
            hint=hint or "Configure the secret in the server's secret store and try again.",
        )


class SecretStore(Protocol):
    def resolve(
        self,
        names: Sequence[str],
        *,
        principal: str | None = None,
        source: str | None = None,
        own_only: bool = False,
    ) -> dict[str, str]:
        """The value of every name for a call by `principal` of a tool of `source` (None:
        outside any call, e.g. a source's start-up), or MissingSecret naming all absent.
        `own_only`: for a source `principal` added itself, only secrets stored for
        `principal` (never the operator's: global ones, environment variables)."""
        ...


#: Why a principal's own source found none of the operator's secrets.
OWN_ONLY_HINT = (
    "A source your principal added uses only secrets stored for your principal (never the "
    "operator's global ones or environment variables): ask the operator to store it with "
    "`lockgate secrets set <name> --principal <you> [--source <that source>]`."
)


def environment_variable(name: str, prefix: str = "LOCKGATE_SECRET_") -> str:
    """The variable that holds secret `name`: `notes_token` -> `LOCKGATE_SECRET_NOTES_TOKEN`.

    Characters a shell cannot put in a variable name become underscores, so `github-token`
    is settable as `LOCKGATE_SECRET_GITHUB_TOKEN`.
    """
    return prefix + re.sub(r"[^A-Za-z0-9_]", "_", name).upper()


class EnvironmentSecrets:
    """Secrets from environment variables, read at each `resolve` (never cached at import)."""

    def __init__(
        self, prefix: str = "LOCKGATE_SECRET_", environ: Mapping[str, str] | None = None
    ) -> None:
        self.prefix = prefix
        self._environ = environ

    def resolve(
        self,
        names: Sequence[str],
        *,
        principal: str | None = None,
        source: str | None = None,
        own_only: bool = False,
    ) -> dict[str, str]:
        """The operator's variables: the same for every principal and source, and never a
        principal's own source's."""
        if own_only and names:
            raise MissingSecret(list(names), hint=OWN_ONLY_HINT)
        environ = os.environ if self._environ is None else self._environ
        found: dict[str, str] = {}
        missing: list[str] = []
        for name in names:
            # An empty variable is treated as unset: it is almost always a deployment slip.
            value = environ.get(environment_variable(name, self.prefix), "")
            if value:
                found[name] = value
            else:
                missing.append(name)
        if missing:
            variables = ", ".join(environment_variable(n, self.prefix) for n in missing)
            raise MissingSecret(missing, hint=f"Set the environment variable(s) {variables}.")
        return found

    def __repr__(self) -> str:
        return f"EnvironmentSecrets(prefix={self.prefix!r})"


class StaticSecrets:
    """Secrets from a fixed mapping (tests, or values loaded from configuration)."""

    def __init__(self, mapping: Mapping[str, str]) -> None:
        self._mapping = dict(mapping)

    def resolve(
        self,
        names: Sequence[str],
        *,
        principal: str | None = None,
        source: str | None = None,
        own_only: bool = False,
    ) -> dict[str, str]:
        """The mapping is everyone's: a principal's own source gets none of it."""
        if own_only and names:
            raise MissingSecret(list(names), hint=OWN_ONLY_HINT)
        missing = [name for name in names if not self._mapping.get(name)]
        if missing:
            raise MissingSecret(missing)
        return {name: self._mapping[name] for name in names}

    def __repr__(self) -> str:  # names only: a repr ends up in tracebacks and logs
        return f"StaticSecrets(names={sorted(self._mapping)!r})"


class Redactor:
    """Replaces every occurrence of known secret values with `[REDACTED]`.

    Apply it to anything before it is stored, logged or returned. It matches exact values
    only: a secret that a tool re-encodes (base64, URL quoting) is not recognised.
    """

    def __init__(self, values: Iterable[str] = ()) -> None:
        # Longest first, so a secret that contains another is replaced whole, in one pass.
        self._values = tuple(
            sorted({v for v in values if len(v) >= MIN_REDACTED_LENGTH}, key=len, reverse=True)
        )
        self._pattern = (
            re.compile("|".join(re.escape(v) for v in self._values)) if self._values else None
        )

    @classmethod
    def from_secrets(cls, secrets: Mapping[str, str]) -> Redactor:
        return cls(secrets.values())

    def extended(self, values: Iterable[str]) -> Redactor:
        """A redactor for these values as well as the ones already known."""
        return Redactor((*self._values, *values))

    def __bool__(self) -> bool:
        return self._pattern is not None

    def redact_text(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(REDACTED, text)

    def redact(self, value: JsonValue) -> JsonValue:
        """A copy of `value` with secrets removed from every string, dict keys included.

        Two keys that differ only in a secret collapse into one; the later one wins.
        """
        if isinstance(value, str):
            return self.redact_text(value)
        if isinstance(value, dict):
            return {self.redact_text(k): self.redact(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.redact(item) for item in value]
        return value

    def redact_exception_message(self, exc: BaseException) -> str:
        """The exception's message, safe to store or show (type name included if empty)."""
        message = str(exc) or type(exc).__name__
        return self.redact_text(message)

    def __repr__(self) -> str:
        return f"Redactor({len(self._values)} values)"
