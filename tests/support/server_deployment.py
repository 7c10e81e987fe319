"""One database and notes directory, and the real `lockgate` processes started on it.

A `Deployment` starts server processes (`lockgate serve --port <free port>`, configured
through environment variables only, like an operator would; forked from a process that has
already imported the server, `simulation.warm_start`), runs the
`lockgate keys ...` commands against its database, and stops everything it started
(SIGTERM, SIGKILL as a last resort). `new_database_url` makes the database of one kind
(a SQLite file, or a fresh PostgreSQL database from the migrated template) and
`make_deployment` lays out its folders.
"""

from __future__ import annotations

import json
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lockgate.machine.tools.notes import NotesSource
from lockgate.simulation import warm_start
from lockgate.simulation.ports import free_port
from lockgate.simulation.warm_start import ServerPopen
from tests.support.lockgate_server import KEY_PATTERN, START_TIMEOUT, LockgateServer
from tests.support.process_env import lockgate_env


@dataclass(frozen=True)
class Key:
    id: str
    principal: str
    secret: str


@dataclass
class Command:
    """A running `lockgate` command, its output going to two files."""

    args: list[str]
    popen: ServerPopen
    stdout_path: Path
    stderr_path: Path

    def finish(self, timeout: float = START_TIMEOUT) -> subprocess.CompletedProcess[str]:
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"`lockgate {' '.join(self.args)}` did not finish in {timeout:g} s")
        return subprocess.CompletedProcess(
            ["lockgate", *self.args],
            code,
            self.stdout_path.read_text(encoding="utf-8"),
            self.stderr_path.read_text(encoding="utf-8"),
        )

    def stop(self) -> None:
        if self.popen.returncode is None:
            self.popen.kill()
            self.popen.wait()

    def key(self, principal: str) -> Key:
        """The key `lockgate keys create` printed."""
        done = self.finish()
        assert done.returncode == 0, done.stderr
        fields = dict(
            line.split(":", 1)
            for line in done.stdout.splitlines()
            if ":" in line and "(" not in line
        )
        key = Key(fields["key id"].strip(), fields["principal"].strip(), fields["key"].strip())
        assert key.principal == principal, done.stdout
        assert KEY_PATTERN.fullmatch(key.secret), done.stdout
        return key


@dataclass
class Deployment:
    database_url: str
    notes_dir: Path
    logs_dir: Path
    #: Settings every process started here gets (a test may override them per process).
    settings: dict[str, str] = field(default_factory=dict)
    servers: list[LockgateServer] = field(default_factory=list)
    #: Commands run so far (each one's output files are numbered).
    commands: int = 0

    def env(self, overrides: dict[str, str]) -> dict[str, str]:
        env = lockgate_env(self.database_url, self.notes_dir, LOCKGATE_MAX_DURATION_SECS="20")
        env.update(self.settings)
        env.update(overrides)
        if any(v in env for v in ("LOCKGATE_CRASH_AT", "LOCKGATE_STOP_AT")):
            env.setdefault("LOCKGATE_FAULT_INJECTION", "1")  # obeyed only when switched on
        return env

    def spawn(self, *args: str, name: str | None = None, **env: str) -> LockgateServer:
        """Start `lockgate serve --port <free port> [args]` without waiting for it."""
        return self.spawn_at(free_port(), *args, name=name, **env)

    def spawn_at(
        self, port: int, /, *args: str, name: str | None = None, **env: str
    ) -> LockgateServer:
        """`spawn` on a given port: a restart on a dead server's port is what its clients
        reconnect to."""
        name = name or f"server-{len(self.servers)}"
        stdout_path = self.logs_dir / f"{name}.stdout"
        stderr_path = self.logs_dir / f"{name}.stderr"
        for path in (stdout_path, stderr_path):
            path.write_bytes(b"")  # a restart under the same name starts a new log
        popen = warm_start.start(
            "lockgate.server.cli",
            ["serve", "--port", str(port), *args],
            env=self.env(env),
            cwd=self.logs_dir,
            stdout=stdout_path,
            stderr=stderr_path,
        )
        server = LockgateServer(name, port, popen, stdout_path, stderr_path)
        self.servers.append(server)
        return server

    def start(self, *args: str, name: str | None = None, **env: str) -> LockgateServer:
        """Start a server and wait until /readyz answers 200."""
        return self.start_at(free_port(), *args, name=name, **env)

    def start_at(
        self, port: int, /, *args: str, name: str | None = None, **env: str
    ) -> LockgateServer:
        """`start` on a given port."""
        server = self.spawn_at(port, *args, name=name, **env)
        server.wait_ready()
        return server

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """Run a `lockgate` command on this deployment's database."""
        return self.cli_start(*args, **env).finish()

    def cli_start(self, *args: str, **env: str) -> Command:
        """Start a `lockgate` command; `finish()` waits for it (others may run meanwhile)."""
        self.commands += 1
        stdout_path = self.logs_dir / f"command-{self.commands}.stdout"
        stderr_path = self.logs_dir / f"command-{self.commands}.stderr"
        popen = warm_start.start(
            "lockgate.server.cli",
            list(args),
            env=self.env(env),
            cwd=self.logs_dir,
            stdout=stdout_path,
            stderr=stderr_path,
        )
        return Command(list(args), popen, stdout_path, stderr_path)

    def create_key(self, principal: str) -> Key:
        """`lockgate keys create <principal>`: the key it prints, once."""
        return self.cli_start("keys", "create", principal).key(principal)

    def revoke_key(self, key_id: str) -> None:
        done = self.cli("keys", "revoke", key_id)
        assert done.returncode == 0, done.stderr
        assert f"revoked {key_id}" in done.stdout

    def audit_lines(self, principal: str | None = None) -> list[dict[str, Any]]:
        """`lockgate audit export` (of one principal's calls): its JSON lines."""
        args = ("audit", "export", *(("--principal", principal) if principal else ()))
        done = self.cli(*args)
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    def effects(self) -> list[dict[str, Any]]:
        """The notes tool's own log of calls that really ran (any process, any instance)."""
        return NotesSource(self.notes_dir).effects()

    def stop_all(self) -> None:
        for server in self.servers:
            if server.exited() is None:
                server.popen.send_signal(signal.SIGTERM)
        for server in self.servers:
            try:
                server.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()


def new_database_url(request: pytest.FixtureRequest, kind: str, directory: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{directory / 'lockgate.db'}"
    from tests.support.postgres import PostgresServer

    server: PostgresServer = request.getfixturevalue("postgres_server")
    template: str = request.getfixturevalue("postgres_template")
    return server.url(server.create_database(template=template))


def make_deployment(database_url: str, directory: Path, **settings: str) -> Deployment:
    logs = directory / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return Deployment(database_url, directory / "notes", logs, dict(settings))
