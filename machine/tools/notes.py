"""A built-in tool source for tests and demos: named text notes, kept in one JSON file.

Its log of calls is what crash tests count: every dispatch appends one line to
`effects.jsonl` (fsynced) before the call returns, so a test in another process can tell how
many times a write really ran, and how many times an idempotent read was re-dispatched.
Both files stay consistent when the process is SIGKILLed: notes are replaced atomically and
a torn last log line is skipped on reading.

The demo needs no secret: it writes local files, and a first run must work with no set-up.
Given an `expected_token`, the same tools act as a credentialed source instead: each declares
the secret `notes_token` (resolved by the secret store at dispatch, from
`LOCKGATE_SECRET_NOTES_TOKEN` in a server) and refuses a call without that exact token, which
is how tests show a secret reaching its call and nowhere else.
"""

from __future__ import annotations

import fcntl
import hmac
import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import JsonValue

from lockgate.machine.policy import PolicyDecision
from lockgate.machine.tools.registry import Tool, ToolContext, ToolFailed, ToolSpec

SOURCE = "notes"
TOKEN_SECRET = "notes_token"
NOTES_FILE = "notes.json"
EFFECTS_FILE = "effects.jsonl"
LOCK_FILE = "notes.lock"

_KEY: dict[str, JsonValue] = {"type": "string", "description": "The note's name."}


def _schema(**properties: JsonValue) -> dict[str, JsonValue]:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(properties),
        "additionalProperties": False,
    }


def _spec(
    name: str,
    description: str,
    parameters: dict[str, JsonValue],
    returns: str,
    *,
    read_only: bool,
) -> ToolSpec:
    return ToolSpec(
        source=SOURCE,
        name=name,
        description=description,
        parameters=parameters,
        returns=returns,
        idempotent=read_only,
        default_policy=PolicyDecision.APPROVE if read_only else PolicyDecision.REQUIRE_APPROVAL,
    )


READ = _spec(
    "read",
    "Read the note stored under key: returns {key, text}; fails if there is no such note.",
    _schema(key=_KEY),
    "dict",
    read_only=True,
)
LIST = _spec("list", "List the keys of all notes, sorted.", _schema(), "list[str]", read_only=True)
WRITE = _spec(
    "write",
    "Store text under key, replacing any note already there: returns {key, written}.",
    _schema(key=_KEY, text={"type": "string", "description": "The note's content."}),
    "dict",
    read_only=False,
)
DELETE = _spec(
    "delete",
    "Delete the note stored under key: returns {key, deleted} (false if there was none).",
    _schema(key=_KEY),
    "dict",
    read_only=False,
)

_Handler = Callable[[dict[str, JsonValue], ToolContext], JsonValue]


@dataclass(frozen=True)
class _NotesTool:
    spec: ToolSpec
    handler: _Handler
    expected_token: str | None = field(repr=False)  # a repr reaches logs and tracebacks

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        if self.expected_token is not None:
            token = context.secrets.get(TOKEN_SECRET)
            # Neither message includes the token, right or wrong.
            if not token:
                raise ToolFailed(f"notes token missing: the call needs the secret {TOKEN_SECRET!r}")
            if not hmac.compare_digest(token.encode(), self.expected_token.encode()):
                raise ToolFailed("notes token rejected")
        return self.handler(arguments, context)


class NotesSource:
    """The `notes` tools. `data_dir=None` keeps everything in memory (one process only).

    Without `expected_token` (the server's demo source) the tools need no secret. With it,
    every tool declares the secret `notes_token` and accepts only this value, so tests can
    check that the right secret reached the call through the secret store.
    """

    #: As `list_sources` shows it: the built-in notes.
    kind = "notes"

    name = SOURCE

    def __init__(self, data_dir: Path | None = None, *, expected_token: str | None = None) -> None:
        self.data_dir = data_dir
        self._expected_token = expected_token
        self._lock = threading.Lock()
        self._memory_notes: dict[str, str] = {}
        self._memory_log: list[dict[str, JsonValue]] = []
        if data_dir is not None:
            data_dir.mkdir(parents=True, exist_ok=True)

    def tools(self) -> Sequence[Tool]:
        handlers: list[tuple[ToolSpec, _Handler]] = [
            (READ, self._read),
            (LIST, self._list),
            (WRITE, self._write),
            (DELETE, self._delete),
        ]
        if self._expected_token is not None:
            handlers = [
                (spec.model_copy(update={"secrets": (TOKEN_SECRET,)}), handler)
                for spec, handler in handlers
            ]
        return [_NotesTool(spec, handler, self._expected_token) for spec, handler in handlers]

    def effects(self) -> list[dict[str, JsonValue]]:
        """Every logged call, oldest first: `{tool, read, key, idempotency_key, principal_id,
        pid}`. `read` is true for read and list, false for write and delete."""
        with self._locked():
            if self.data_dir is None:
                return [dict(entry) for entry in self._memory_log]
            path = self.data_dir / EFFECTS_FILE
            if not path.exists():
                return []
            entries: list[dict[str, JsonValue]] = []
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    entries.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line torn by a kill mid-append: that call never returned
            return entries

    # -- the tools ---------------------------------------------------------------------------

    def _read(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        key = _string(arguments, "key")
        with self._locked():
            self._log(READ, key, context)
            text = self._load().get(key)
        if text is None:
            raise ToolFailed(f"there is no note {key!r}; tools.notes.list() shows the keys")
        return {"key": key, "text": text}

    def _list(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        with self._locked():
            self._log(LIST, None, context)
            return list(sorted(self._load()))

    def _write(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        key, text = _string(arguments, "key"), _string(arguments, "text")
        with self._locked():
            notes = self._load()
            notes[key] = text
            self._save(notes)
            self._log(WRITE, key, context)  # after the effect: the log counts effects done
        return {"key": key, "written": True}

    def _delete(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        key = _string(arguments, "key")
        with self._locked():
            notes = self._load()
            deleted = notes.pop(key, None) is not None
            if deleted:
                self._save(notes)
            self._log(DELETE, key, context)
        return {"key": key, "deleted": deleted}

    # -- storage -----------------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One caller at a time: threads through the lock, processes through flock."""
        with self._lock:
            if self.data_dir is None:
                yield
                return
            with open(self.data_dir / LOCK_FILE, "a+b") as lock_file:
                fcntl.flock(lock_file, fcntl.LOCK_EX)  # released when the file closes
                yield

    def _load(self) -> dict[str, str]:
        if self.data_dir is None:
            return dict(self._memory_notes)
        path = self.data_dir / NOTES_FILE
        if not path.exists():
            return {}
        loaded: dict[str, str] = json.loads(path.read_text(encoding="utf-8"))
        return loaded

    def _save(self, notes: dict[str, str]) -> None:
        if self.data_dir is None:
            self._memory_notes = dict(notes)
            return
        # Write aside, then rename over: a kill at any point leaves the old or the new file.
        fd, tmp = tempfile.mkstemp(dir=self.data_dir, prefix=".notes.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(notes, f, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.data_dir / NOTES_FILE)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _log(self, spec: ToolSpec, key: str | None, context: ToolContext) -> None:
        entry: dict[str, JsonValue] = {
            "tool": spec.full_name,
            "read": spec.idempotent,
            "key": key,
            "idempotency_key": context.idempotency_key,
            "principal_id": context.principal_id,
            "pid": os.getpid(),
        }
        if self.data_dir is None:
            self._memory_log.append(entry)
            return
        with open(self.data_dir / EFFECTS_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _string(arguments: dict[str, JsonValue], name: str) -> str:
    # The registry validates arguments first; this guards direct calls (tests, other hosts).
    value = arguments.get(name)
    if not isinstance(value, str):
        raise ToolFailed(f"argument {name!r} must be a string")
    return value
