"""The real-process simulation: `lockgate serve` processes (with the leaking canary tools,
`simulation.serve`) on one database, SIGKILLed at the armed crash point (or stopped there,
as a stalled process is), restarted, and driven through their real interfaces: MCP over
HTTP with the official client, a raw persistent session where the wire is the point.

What the harness believes comes from the processes themselves, never from its own notes:
each server appends to an evidence file what it reached, where it fired and where it
stopped (`machine.faults.Faults.from_environment`), and each death's exit status is read
back. A run whose armed point never fired, or whose server died of anything but SIGKILL,
fails; the invariants are then checked on the database and the tools' data.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx2

from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.migrate import upgrade
from lockgate.machine.db.store import SqlStore
from lockgate.machine.tools.notes import NotesSource
from lockgate.server.keys import ApiKeys
from lockgate.simulation import warm_start
from lockgate.simulation.canary import TOKEN_SECRET as CANARY_TOKEN
from lockgate.simulation.held import RELEASE_ENV
from lockgate.simulation.invariants import CallLists, Violation, calls_made, check_all, history
from lockgate.simulation.ports import free_port
from lockgate.simulation.scenarios import Scenario, ScenarioFailed
from lockgate.simulation.sweep import RunResult
from lockgate.simulation.world import CANARY
from lockgate.spec import CrashPoint

ROOT = Path(__file__).resolve().parent.parent
MAX_RESTARTS = 3
#: How long a condition the harness waits for may take (a server booting, a lease lapsing).
PATIENCE_SECS = 60.0
#: Settings every server of a simulated deployment runs with: short leases and sweeps so
#: that real time crosses them within a run.
DEPLOYMENT_SETTINGS = {
    # The simulated client stands in for the person: it accepts with resume's action.
    "approval_mode": "model",
    "max_duration_secs": "5",
    "lease_ttl": "3",
    "heartbeat_interval": "0.5",
    "sweep_interval": "0.5",
    # One process per server: the armed crash kills the instance the run talks to (with
    # several workers, their supervisor would replace the one that crashed).
    "workers": "1",
}


class ProcessKilled(Exception):
    """A server process died under a request (the SIGKILL at the armed point)."""

    def __init__(self, message: str, server: ServerProcess | None = None) -> None:
        super().__init__(message)
        self.server = server


def until(condition: Callable[[], bool], what: str, timeout: float = PATIENCE_SECS) -> None:
    """Poll `condition` until it holds (the deadline bounds a harness or server bug)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise ScenarioFailed(f"gave up waiting: {what}")
        time.sleep(0.05)  # polling another process's state; the deadline bounds it


class ServerProcess:
    """One `lockgate serve` process on a free loopback port."""

    def __init__(self, name: str, env: dict[str, str], log: Path) -> None:
        self.name = name
        self.port = free_port()
        # Forked from a process that has already imported the server (`warm_start`): a
        # boot then costs what the server itself does, not two seconds of imports.
        self.proc = warm_start.start(
            "lockgate.simulation.serve",
            ["--port", str(self.port)],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=log,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + PATIENCE_SECS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ProcessKilled(f"{self.name} exited with {self.proc.returncode} at boot", self)
            try:
                if httpx2.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx2.TransportError:
                pass
            time.sleep(0.1)  # polling a starting process; the deadline bounds it
        raise RuntimeError(f"{self.name} did not become ready within {PATIENCE_SECS:.0f} s")

    @property
    def stopped(self) -> bool:
        """Stopped by a signal (state T in /proc): it stopped itself at its stop point."""
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except OSError:
            return False
        return stat.rpartition(")")[2].split()[0] in ("T", "t")

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> int:
        self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait()

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM (resuming it first if it is stopped), and its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


@dataclass
class Death:
    server: str
    status: int
    deliberate: bool = False


@dataclass
class Deployment:
    """The servers of one run, their database, tools' data and evidence."""

    workdir: Path
    settings: dict[str, str]
    database_url: str = ""
    key: str = ""
    servers: dict[str, ServerProcess] = field(default_factory=dict)
    deaths: list[Death] = field(default_factory=list)
    #: The crash point still to be armed (it fires once), in one live server at a time.
    pending_crash: CrashPoint | None = None
    armed_in: ServerProcess | None = None

    def __post_init__(self) -> None:
        self.database_url = self.database_url or f"sqlite:///{self.workdir / 'lockgate.db'}"
        self.evidence = self.workdir / "evidence.log"
        self.log = self.workdir / "server.log"
        #: Created by a scenario to let `tools.held.wait()` return (simulation/held.py).
        self.release = self.workdir / "release"
        self.db = open_engine(self.database_url)
        upgrade(self.db)
        self.key = ApiKeys(SqlStore(self.db)).create("sim").secret
        self.signing_key = secrets.token_urlsafe(32)

    def env(self, name: str, *, stop_at: CrashPoint | None = None) -> dict[str, str]:
        env = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "LOCKGATE_NOTES_DIR": str(self.workdir / "notes"),
            RELEASE_ENV: str(self.release),
            "LOCKGATE_SECRET_NOTES_TOKEN": CANARY,
            f"LOCKGATE_SECRET_{CANARY_TOKEN.upper()}": CANARY,
            "LOCKGATE_INSTANCE_NAME": name,
            "LOCKGATE_FAULT_INJECTION": "1",
            "LOCKGATE_FAULT_EVIDENCE": str(self.evidence),
            "PYTHONPATH": str(ROOT),
        }
        for key in ("LOCKGATE_CRASH_AT", "LOCKGATE_STOP_AT"):
            env.pop(key, None)
        env.pop("LOCKGATE_SIGNING_KEYS", None)
        if not self.database_url.startswith("sqlite"):
            # The run's instances share one link-signing key, as a deployment's must; on
            # SQLite they share the key file next to the database.
            env["LOCKGATE_SIGNING_KEYS"] = self.signing_key
        for key, value in {**DEPLOYMENT_SETTINGS, **self.settings}.items():
            env[f"LOCKGATE_{key.upper()}"] = value
        if self.pending_crash is not None and not self._armed_alive():
            env["LOCKGATE_CRASH_AT"] = self.pending_crash.name
        if stop_at is not None:
            env["LOCKGATE_STOP_AT"] = stop_at.name
        return env

    def _armed_alive(self) -> bool:
        return self.armed_in is not None and self.armed_in.proc.poll() is None

    def start(self, name: str = "sim-a", *, stop_at: CrashPoint | None = None) -> ServerProcess:
        """Start `name`; a point reached during its boot kills it there, and it is started
        again, as a supervisor would."""
        for _ in range(MAX_RESTARTS + 1):
            env = self.env(name, stop_at=stop_at)
            try:
                server = ServerProcess(name, env, self.log)
            except ProcessKilled as killed:
                assert killed.server is not None
                self.died(killed.server)
                continue
            if "LOCKGATE_CRASH_AT" in env:
                self.armed_in = server
            if self.fired():
                self.pending_crash = None
            self.servers[name] = server
            return server
        raise RuntimeError(f"{name} could not be started")

    def died(self, server: ServerProcess, *, deliberate: bool = False) -> None:
        status = server.proc.wait()
        self.deaths.append(Death(server.name, status, deliberate))
        if self.fired():
            self.pending_crash = None
        if self.servers.get(server.name) is server:
            del self.servers[server.name]

    def stop(self, server: ServerProcess) -> int:
        """SIGTERM `server` and its exit status. A drain that reaches the armed point dies
        of its SIGKILL there: that is the armed crash, raised as ProcessKilled for the
        caller to record (`died`) and restart, as a supervisor would."""
        status = server.terminate()
        if self.servers.get(server.name) is server:
            del self.servers[server.name]
        if status == -signal.SIGKILL and self.pending_crash is not None and self.fired():
            raise ProcessKilled(f"{server.name} died draining, at its armed point", server)
        return status

    def restart(self, server: ServerProcess) -> ServerProcess:
        self.died(server)
        return self.start(server.name)

    def check_alive_except(self, spared: ServerProcess) -> None:
        for server in list(self.servers.values()):
            if server is not spared and server.proc.poll() is not None:
                raise ProcessKilled(f"{server.name} died ({server.proc.returncode})", server)

    def check_alive(self) -> None:
        """A server that died while nobody was asking it anything (its maintenance loop
        reached the armed point) is found here, and restarted by the run's loop."""
        for server in list(self.servers.values()):
            if server.proc.poll() is not None:
                raise ProcessKilled(f"{server.name} died ({server.proc.returncode})", server)

    def evidence_lines(self) -> list[tuple[str, str]]:
        if not self.evidence.exists():
            return []
        lines = self.evidence.read_text(encoding="utf-8").splitlines()
        return [(parts[0], parts[1]) for line in lines if len(parts := line.split()) >= 2]

    def fired(self) -> list[str]:
        return [point for what, point in self.evidence_lines() if what == "fired"]

    def reached(self) -> set[CrashPoint]:
        return {CrashPoint.parse(p) for what, p in self.evidence_lines() if what == "reached"}

    def close(self) -> None:
        for server in list(self.servers.values()):
            server.terminate()
        self.db.dispose()


@contextmanager
def deployment(
    scenario: Scenario, database_url: str | None = None
) -> Iterator[tuple[Deployment, Path]]:
    workdir = Path(tempfile.mkdtemp(prefix="lockgate-simproc-"))
    settings = {
        k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in scenario.settings.items()
    }
    settings.update(scenario.real_process_settings)
    deployed = Deployment(workdir, settings, database_url or "")
    try:
        yield deployed, workdir
    finally:
        deployed.close()
        shutil.rmtree(workdir, ignore_errors=True)


def run_in_process(
    scenario: Scenario,
    point: CrashPoint | None,
    database_url: str | None = None,
    baseline: CallLists | None = None,
) -> RunResult:
    """One scenario against real `lockgate serve` processes, SIGKILLed at `point`."""
    from lockgate.simulation.remote import RemoteClient, remote_drive

    drive = remote_drive(scenario)
    trace: list[str] = []
    violations: list[Violation] = []
    reached: set[CrashPoint] = set()
    calls: CallLists = {}
    fired: list[CrashPoint] = []
    with deployment(scenario, database_url) as (deployed, workdir):
        deployed.pending_crash = point
        try:
            client = RemoteClient(deployed)
            for _ in range(MAX_RESTARTS + 1):
                try:
                    drive(client)
                    trace.append("client done")
                    break
                except ProcessKilled as killed:
                    if killed.server is None:
                        raise
                    trace.append(f"{killed.server.name} died: {killed}")
                    restarted = deployed.restart(killed.server)
                    if killed.server is client.server:
                        client.server = restarted
            else:
                violations.append(Violation("the client finishes", "the drive never ended"))
            for server in list(deployed.servers.values()):
                try:
                    status = deployed.stop(server)
                except ProcessKilled as killed:  # its drain reached the armed point
                    trace.append(str(killed))
                    status = deployed.stop(deployed.restart(server))
                trace.append(f"{server.name} stopped with {status}")
            deployed.servers.clear()
            fired = [CrashPoint.parse(p) for p in deployed.fired()]
            trace += [f"{d.server} died with status {d.status}" for d in deployed.deaths]
            violations += _deaths_checked(deployed, point, fired)
            effects = NotesSource(workdir / "notes").effects()
            server_logs = deployed.log.read_text(encoding="utf-8").splitlines()
            # Real time does not pass beyond the sessions' leases here: a report still
            # waiting for its session's next GET is a durable wait, not a loss.
            violations += check_all(
                deployed.db,
                effects,
                server_logs,
                CANARY,
                reports_may_wait=True,
                baseline=baseline,
                inbox=client.inbox,
            )
            calls = calls_made(deployed.db)
            if violations:
                trace += ["persisted transitions:", *history(deployed.db, [])]
        except ScenarioFailed as failed:
            violations.append(Violation("the client gets only legitimate answers", str(failed)))
        reached = deployed.reached()
    return RunResult(
        scenario=scenario.name,
        plan=(point,) if point else (),
        fired=fired,
        after_last_crash=[],
        reached=reached,
        violations=violations,
        trace=trace,
        calls=calls,
    )


def _deaths_checked(
    deployed: Deployment, point: CrashPoint | None, fired: list[CrashPoint]
) -> list[Violation]:
    out = []
    if point is not None and point not in fired:
        out.append(Violation("the armed point fires", f"{point.name} never fired"))
    for death in deployed.deaths:
        if death.status != -signal.SIGKILL:
            out.append(
                Violation(
                    "a server dies only of the armed SIGKILL",
                    f"{death.server} exited with status {death.status}",
                )
            )
    killed = sum(1 for d in deployed.deaths if not d.deliberate)
    if killed != len(fired):
        out.append(
            Violation(
                "a server dies only of the armed SIGKILL",
                f"{killed} servers died but {len(fired)} crash points fired",
            )
        )
    return out


__all__ = [
    "Deployment",
    "ProcessKilled",
    "ServerProcess",
    "run_in_process",
    "until",
]
