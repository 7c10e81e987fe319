"""The soak under kills: clients doing what agents and people do, against one `lockgate serve`
or a fleet of them behind a round-robin proxy, while an instance is SIGKILLed and restarted
every few seconds; then the checker's figures (`bench.soak_check`).

    .venv/bin/python -m bench.soak                          # one instance, SQLite, a minute
    .venv/bin/python -m bench.soak --instances 3 --seconds 600 --clients 16   # the fleet

The `browser` approvals are a person's: an approver of every client's principal, signed in
(their session opened on the database, as a finished sign-in leaves it; the ceremonies are
tested apart), deciding through the page's API behind the proxy like the clients.

A fleet runs on a throwaway PostgreSQL server (Debian's `postgresql` package). Exit status 1
when a figure that must be zero is not (hung requests, duplicated effects, approvals
consumed twice, stranded executions, secrets found).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import soak_report
from bench.servers import LOCKGATE, lockgate_env
from bench.soak_check import Figures, check
from bench.soak_clients import ClientLog, Person, SoakClient
from lockgate.machine.db.audit_queries import AuditQueries
from lockgate.machine.db.connect import open_engine
from lockgate.simulation import warm_start
from lockgate.simulation.ports import free_port
from lockgate.spec import ExecutionStatus as E
from tests.support.people import people_of
from tests.support.round_robin import serve_proxy

#: How long executions left running may take to settle once the kills stop.
SETTLE_SECS = 90.0
READY_SECS = 60.0


class Instance:
    """One `lockgate serve` on a fixed port, killed and restarted in place."""

    def __init__(self, name: str, env: dict[str, str], workdir: Path) -> None:
        self.name, self.env, self.workdir = name, env, workdir
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.incarnation = 0
        self.logs: list[Path] = []
        self.process: warm_start.ServerPopen | None = None

    def start(self) -> None:
        self.incarnation += 1
        log = self.workdir / f"{self.name}-{self.incarnation}.log"
        self.logs.append(log)
        # Forked from a process that has already imported the server (`warm_start`): the
        # soak is about what survives the kills, not about paying the imports at each boot.
        self.process = warm_start.start(
            "lockgate.server.cli",
            ["serve", "--port", str(self.port)],
            env={**self.env, "LOCKGATE_INSTANCE_NAME": self.name},
            cwd=self.workdir,
            stdout=log,
            stderr=log,
        )
        deadline = time.monotonic() + READY_SECS
        import httpx2

        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {log.read_text()[-2000:]}")
            try:
                if httpx2.get(f"{self.base_url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx2.TransportError:
                pass
            time.sleep(0.05)  # polls readiness; nothing else signals it
        raise RuntimeError(f"{self.name} was not ready within {READY_SECS:g} s")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def create_key(env: dict[str, str], principal: str) -> str:
    done = subprocess.run(
        [str(LOCKGATE), "keys", "create", principal], env=env, capture_output=True, text=True
    )
    found = re.search(r"lg_[A-Za-z0-9_-]+", done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"could not create a key: {done.stdout}{done.stderr}")
    return found.group(0)


def signed_in_person(database_url: str, principals: list[str]) -> Person:
    """The person who approves on the page: an approver of `principals`, signed in."""
    with people_of(database_url) as people:
        approver = people.add("Soak operator", principals=principals)
        return Person(people.open_session(approver, "passkey").token)


def settle(database_url: str) -> None:
    """Wait (bounded) until no execution is queued or running: recovery's work is done."""
    deadline = time.monotonic() + SETTLE_SECS
    while time.monotonic() < deadline:
        engine = open_engine(database_url)
        try:
            busy = [
                e for e in AuditQueries(engine).executions() if e.status in (E.PENDING, E.RUNNING)
            ]
        finally:
            engine.dispose()
        if not busy:
            return
        time.sleep(0.5)  # polls the database; the checker counts what is left as stranded


def soak(args: argparse.Namespace, workdir: Path) -> Figures:
    canary = f"soak-canary-{secrets.token_hex(8)}"
    signing_key = secrets.token_urlsafe(32)
    postgres = None
    if args.instances > 1:
        from bench.__main__ import postgres_url

        made = postgres_url()
        if made is None:
            raise SystemExit("a fleet needs PostgreSQL (apt-get install postgresql)")
        postgres, database_url = made
    else:
        database_url = f"sqlite:///{workdir / 'lockgate.db'}"
    # Clients and people reach the fleet through the proxy: its URL is the public one that
    # approval links name (and that the page's same-origin check expects).
    proxy_port = free_port()
    env = lockgate_env(
        database_url,
        workdir,
        LOCKGATE_PUBLIC_URL=f"http://127.0.0.1:{proxy_port}",
        LOCKGATE_SECRET_NOTES_TOKEN=canary,
        LOCKGATE_LEASE_TTL="2",
        LOCKGATE_HEARTBEAT_INTERVAL="0.5",
        LOCKGATE_SSE_RETRY_MS="500",
        LOCKGATE_RESPONSE_DEADLINE_SECS="30",
        LOCKGATE_SIGNING_KEYS=signing_key,
        LOCKGATE_LOG_FORMAT="json",
        # The product's default: one worker process per core behind each instance's port (a
        # kill takes the whole server, its workers with it).
        LOCKGATE_WORKERS="0",
    )
    instances = [Instance(f"soak-{n}", env, workdir) for n in range(args.instances)]
    kills = 0
    stop = threading.Event()
    try:
        for instance in instances:
            instance.start()
        # Each client an agent of its own (a principal, with its own limits), as in the field.
        principals = [f"agent-{n}" for n in range(args.clients)]
        keys = [create_key(env, principal) for principal in principals]
        person = signed_in_person(database_url, principals)
        proxies = serve_proxy([i.base_url for i in instances], proxy_port)
        proxy = next(proxies)

        def killer() -> None:
            nonlocal kills
            rng = random.Random(args.seed)
            while not stop.wait(args.kill_every):
                victim = rng.choice(instances)
                victim.kill()
                kills += 1
                victim.start()

        thread = threading.Thread(target=killer, name="soak-killer", daemon=True)
        thread.start()
        until = time.monotonic() + args.seconds
        clients = [
            SoakClient(n, proxy.url, proxy.base_url, keys[n], args.seed, person)
            for n in range(args.clients)
        ]

        async def everyone() -> list[ClientLog]:
            return list(await asyncio.gather(*(c.run(until) for c in clients)))

        logs = asyncio.run(everyone())
        stop.set()
        thread.join()
        settle(database_url)
        proxies.close()
        return check(
            database_url,
            workdir / "notes",
            logs,
            [log for i in instances for log in i.logs],
            # The person's session secret too: it is theirs alone (the database keeps
            # its hash), so no row, log line or client's view may carry it.
            [signing_key, canary, person.cookie.split(".", 1)[1]],
            kills,
        )
    finally:
        stop.set()
        for instance in instances:
            instance.stop()
        if postgres is not None:
            postgres.stop()  # type: ignore[attr-defined]


def rerender() -> None:
    """RESULTS.md again, from the recorded results, profiles and soaks."""
    from bench.report import render

    here = Path(__file__).resolve().parent
    results, profiles = here / "results.json", here / "profiles.json"
    if results.exists():
        loaded = json.loads(profiles.read_text()) if profiles.exists() else {}
        text = render(json.loads(results.read_text()), loaded, soak_report.load())
        (here / "RESULTS.md").write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--instances", type=int, default=1, help="more than 1: PostgreSQL")
    parser.add_argument("--kill-every", type=float, default=5.0, help="seconds between kills")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--record", metavar="LABEL", help="keep the figures in bench/soaks.json (RESULTS.md)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lockgate-soak-") as folder:
        started = time.monotonic()
        figures = soak(args, Path(folder))
    print(
        f"soak: {args.clients} clients, {args.instances} instance(s), a kill every "
        f"{args.kill_every:g} s, {args.seconds:g} s (seed {args.seed}; "
        f"{time.monotonic() - started:.0f} s in all)"
    )
    print(figures.table())
    if args.json is not None:
        args.json.write_text(json.dumps(figures.rows, indent=2) + "\n")
    if args.record is not None:
        command = "python -m bench.soak " + " ".join(sys.argv[1:])
        soak_report.record(args.record, command, figures.rows, time.monotonic() - started)
        rerender()
    if figures.failures:
        print(f"FAILED: {', '.join(figures.failures)} must be 0", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
