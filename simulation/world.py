"""A simulated deployment: one database, the tools' data on disk, a clock, and instances that
boot, crash and boot again.

Nothing survives a crash but what the real system keeps: the database and the tools' data.
A crashed runtime is abandoned (its threads were never started; its sandbox pool is closed)
and a new incarnation boots on the same database, recovering through the real boot path.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Hashable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import JsonValue

from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.migrate import upgrade
from lockgate.machine.engine import Action
from lockgate.machine.faults import Faults
from lockgate.machine.runtime import Runtime
from lockgate.machine.sandbox import Sandbox, SandboxLimits
from lockgate.machine.secret_store import SecretCipher, StoredSecrets, new_key
from lockgate.machine.settings import Settings
from lockgate.machine.tools.notes import NotesSource
from lockgate.machine.views import ExecutionView
from lockgate.simulation.canary import TOKEN_SECRET as CANARY_TOKEN
from lockgate.simulation.canary import CanarySource
from lockgate.simulation.desk import DeskSource
from lockgate.simulation.http_notes import SOURCE as HTTP_SOURCE
from lockgate.simulation.http_notes import notes_api
from lockgate.simulation.webhook_endpoint import WebhookEndpoint

#: Passed to the notes tools and the leaking canary tools at dispatch; it must never appear
#: in any record or log.
CANARY = "canary-5eb1d0c4-never-store-me"
#: The secret store's key for every simulated deployment (the store's rows are per run).
SECRETS_KEY = new_key()


@functools.cache
def _migrated_template() -> Path:
    """A migrated SQLite file made once per process; each run starts from a copy (the
    migrations themselves are tested elsewhere, and rerunning them costs most of a run)."""
    folder = Path(tempfile.mkdtemp(prefix="lockgate-sim-template-"))
    atexit.register(shutil.rmtree, folder, True)
    engine = open_engine(f"sqlite:///{folder / 'template.db'}")
    upgrade(engine)
    engine.dispose()  # the last connection closing checkpoints the WAL into the file
    return folder / "template.db"


class DatabaseSlot:
    """A SQLite file that simulated runs use one after another, and the one engine kept open
    on it for all of them.

    Why not an engine per run, or per incarnation, as a real process has: SQLAlchemy
    compiles each statement once per engine (its cache is keyed by the engine's dialect), and
    compiling every statement again for each run's boots was over a third of the sweep's
    time. What a process's death drops is still dropped: each incarnation's end disposes
    the engine's connections (`World.abandon`), and only the compiled statements, which
    hold no state of the database, outlive it."""

    def __init__(self) -> None:
        folder = Path(tempfile.mkdtemp(prefix="lockgate-sim-slot-", dir=scratch_dir()))
        atexit.register(shutil.rmtree, folder, True)
        self.path = folder / "lockgate.db"
        self.url = f"sqlite:///{self.path}"
        self.engine = open_engine(self.url)

    def fresh(self) -> None:
        """A newly migrated database in the slot (no connection is open on it)."""
        self.engine.dispose()
        for leftover in ("-wal", "-shm", "-journal"):
            Path(f"{self.path}{leftover}").unlink(missing_ok=True)
        shutil.copyfile(_migrated_template(), self.path)


class DatabaseSlots:
    """This process's free slots: a world takes one and gives it back when it closes (a
    forked process starts with none of its parent's, whose engines it must not use)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.free: list[DatabaseSlot] = []

    def take(self) -> DatabaseSlot:
        if self.pid != os.getpid():
            self.pid, self.free = os.getpid(), []
        slot = self.free.pop() if self.free else DatabaseSlot()
        slot.fresh()
        return slot

    def give_back(self, slot: DatabaseSlot) -> None:
        slot.engine.dispose()
        if self.pid == os.getpid():
            self.free.append(slot)


SLOTS = DatabaseSlots()


class SpareSandboxes:
    """Sandboxes of dead incarnations, handed out again. A real crash ends the sandbox's
    worker processes with the server; here starting and stopping them (a fork, and a wait
    for each end) was a sixth of a simulated run, and they hold nothing of a run's: each
    step brings its code and snapshot and takes its result away, and a sandbox is kept
    only when it is idle (not stopped, no step running or waiting). What a crash leaves is
    in the database, where recovery reads it, never in a sandbox."""

    def __init__(self, kept: int = 2) -> None:
        self.kept = kept
        self._spare: dict[Hashable, list[Sandbox]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(
        namespace: Mapping[str, Sequence[str]],
        limits: SandboxLimits | None,
        max_processes: int,
        max_per_principal: int | None,
    ) -> Hashable:
        shape = tuple(sorted((source, tuple(tools)) for source, tools in namespace.items()))
        # As the sandbox's own slots count them (`FairSlots`).
        per_principal = min(max_per_principal or max_processes, max_processes)
        return (shape, limits or SandboxLimits(), max_processes, per_principal)

    def take(
        self,
        namespace: Mapping[str, Sequence[str]],
        limits: SandboxLimits | None = None,
        max_processes: int = 4,
        max_per_principal: int | None = None,
    ) -> Sandbox:
        """A spare sandbox made with these arguments, or a new one (`Sandbox`'s signature)."""
        key = self._key(namespace, limits, max_processes, max_per_principal)
        with self._lock:
            spare = self._spare.get(key)
            if spare:
                return spare.pop()
        return Sandbox(namespace, limits, max_processes, max_per_principal)

    def give_back(self, sandbox: Sandbox) -> None:
        """Keep it for a later incarnation if it is idle, else close it."""
        if sandbox.idle:
            key = self._key(
                sandbox.namespace,
                sandbox.limits,
                sandbox.slots.capacity,
                sandbox.slots.per_principal,
            )
            with self._lock:
                spare = self._spare.setdefault(key, [])
                if len(spare) < self.kept:
                    spare.append(sandbox)
                    return
        sandbox.close()

    def close(self) -> None:
        with self._lock:
            spares = [s for spare in self._spare.values() for s in spare]
            self._spare.clear()
        for sandbox in spares:
            sandbox.close()


SANDBOXES = SpareSandboxes()
atexit.register(SANDBOXES.close)


#: Settings read, by (database URL, a scenario's overrides): the environment does not change
#: while a sweep runs, reading it is a tenth of a boot, and the slots' URLs come back run
#: after run. A scenario that changes its overrides between boots gets another entry.
_SETTINGS_READ: dict[tuple[str, str], Settings] = {}


def _settings(database_url: str, overrides: dict[str, Any]) -> Settings:
    key = (database_url, repr(sorted(overrides.items())))
    read = _SETTINGS_READ.get(key)
    if read is None:
        read = Settings(
            **{
                "database_url": database_url,
                "max_duration_secs": 5,
                "secrets_key": SECRETS_KEY,
                **overrides,
            }
        )
        if len(_SETTINGS_READ) > 4096:  # PostgreSQL runs bring a new URL each time
            _SETTINGS_READ.clear()
        _SETTINGS_READ[key] = read
    return read


def scratch_dir() -> str | None:
    """A memory-backed directory when there is one: every commit is fsynced, and a run needs
    no durability beyond the run (the crash is simulated, the machine stays up)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


class SimClock:
    """Simulated time: it moves only when a scenario says so."""

    def __init__(self) -> None:
        self.now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


class ScenarioFailed(AssertionError):
    """The client got an answer no client should ever get."""


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise ScenarioFailed(what)


class LogCapture(logging.Handler):
    """Everything the system logs during a run, for the canary check."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class World:
    def __init__(
        self,
        workdir: Path,
        database_url: str | None = None,
        *,
        settings: dict[str, Any] | None = None,
        faults: Faults | None = None,
        over_http: bool = False,
    ) -> None:
        self.workdir = workdir
        #: The default SQLite database's slot; a database given by URL (a fresh PostgreSQL
        #: database) gets an engine per incarnation, as a real process has.
        self.slot: DatabaseSlot | None = None
        if database_url is None:
            self.slot = SLOTS.take()
            database_url = self.slot.url
        self.database_url = database_url
        self.settings = dict(settings or {})
        #: Shared by every incarnation: each armed point fires once, wherever it is reached
        #: first (a crash during the recovery from an earlier crash included).
        self.faults = faults or Faults()
        self.clock = SimClock()
        self.notes = NotesSource(workdir / "notes")
        #: The notes over HTTP (`tools.api.*`, an OpenAPI source), for the scenarios whose
        #: calls go through the OpenAPI source; its state outlives every crash, as the
        #: notes' files do.
        self.world_id = uuid.uuid4().hex
        self.http_api = notes_api() if over_http else None
        #: The operator's webhook endpoint (it outlives every crash, as the notes do).
        self.webhooks = WebhookEndpoint()
        self.runtimes: list[Runtime] = []
        self.boots = 0
        self._secrets_stored = False

    def boot(self, *, name: str = "sim-a") -> Runtime:
        """Start a new incarnation of instance `name` and run its boot recovery."""
        self.boots += 1
        config = _settings(self.database_url, self.settings).model_copy(
            update={"instance_name": name}
        )
        runtime = Runtime.create(
            config,
            sources=[
                self.notes,
                CanarySource(),
                DeskSource(self.notes),
                *([self.http_api.source(self.world_id)] if self.http_api else []),
            ],
            faults=self.faults,
            clock=self.clock,
            database=self.slot.engine if self.slot is not None else None,
            sandboxes=SANDBOXES.take,
        )
        runtime.engine.webhooks.post = self.webhooks.receive
        if not self._secrets_stored:
            # In the server's own store, encrypted: the canary scan reads its table too, so
            # a value stored in the clear (or a key that leaked into it) is a violation.
            store = StoredSecrets(runtime.engine.store.secrets, SecretCipher([SECRETS_KEY]))
            for name in ("notes_token", CANARY_TOKEN):
                store.set(name, CANARY)
            self._secrets_stored = True
        self.runtimes.append(runtime)
        runtime.start(background=False)
        return runtime

    def effects(self) -> list[dict[str, JsonValue]]:
        """What every tool with a log made: the notes, and the notes over HTTP."""
        made = self.notes.effects()
        if self.http_api is not None:
            made += self.http_api.effects(self.world_id)
        return made

    def abandon(self, runtime: Runtime) -> None:
        """The process died: keep nothing from it (but an idle sandbox, `SpareSandboxes`)."""
        SANDBOXES.give_back(runtime.sandbox)
        runtime.engine.store.engine.dispose()
        if runtime in self.runtimes:
            self.runtimes.remove(runtime)

    def close(self) -> None:
        if self.http_api is not None:
            self.http_api.forget(self.world_id)
        for runtime in self.runtimes:
            SANDBOXES.give_back(runtime.sandbox)
            runtime.engine.store.engine.dispose()
        self.runtimes = []
        if self.slot is not None:
            SLOTS.give_back(self.slot)
            self.slot = None


class Client:
    """What a scenario's client knows and does. Its memory outlives crashes (it is the
    client's, not the server's); the server it talks to is whichever incarnation is up."""

    def __init__(self, world: World, runtime: Runtime, principal: str = "alice") -> None:
        self.world, self.runtime, self.principal = world, runtime, principal
        self.memory: dict[str, Any] = {}
        self.outcomes: list[ExecutionView] = []

    def code(self, code: str) -> str:
        """The scenario's code, its notes calls sent over HTTP when the world serves them
        so (the same calls, through the OpenAPI source)."""
        if self.world.http_api is None:
            return code
        return code.replace("tools.notes.", f"tools.{HTTP_SOURCE}.")

    def execute(self, code: str) -> ExecutionView:
        return self.runtime.engine.execute(self.principal, self.code(code))

    def resume(self, execution_id: str, action: Action) -> ExecutionView:
        return self.runtime.engine.resume(execution_id, self.principal, action)

    def get(self, execution_id: str) -> ExecutionView:
        return self.runtime.engine.get(execution_id, self.principal)

    def answer(self, execution_id: str, answers: dict[str, JsonValue]) -> ExecutionView:
        """Answers to what the paused call's tool asked (as any door gives them)."""
        return self.runtime.engine.answers.give(execution_id, self.principal, answers)

    def remember(self, key: str, compute: Any) -> Any:
        """Do `compute` once; after a crash the client knows the answer if it got one."""
        if key not in self.memory:
            self.memory[key] = compute()
        return self.memory[key]
