"""Real `lockgate serve` processes on loopback, and real MCP clients talking to them.

A `Deployment` is one database plus one notes directory; it starts server processes on it
(`.venv/bin/lockgate serve --port <free port>`, configured through environment variables
only, like an operator would), runs the `lockgate keys ...` commands against it, and stops
everything it started (SIGTERM, SIGKILL as a last resort). Each process's stdout and stderr
go to files, so a test can read the banner (the API key printed once) and the JSON logs,
and nothing is left as an unclosed pipe.

Nothing here sleeps to hide a race: every wait polls a condition with a deadline.

Fixtures: `shared` is one server per database kind for the whole session (the fast tests
share it, each with its own executions and note keys), `short` a second one with a 0.2 s
wait budget and a 1 s approval TTL (both come from `fleet`, which starts them side by
side); `deployment` is a fresh database per test for the tests that start, kill and restart
their own servers. Test modules load them with `pytest_plugins = ["tests.support.servers"]`, so
each is defined once for the session (a session fixture imported into several modules would
be several fixtures, each starting its own servers). They also import helpers from here
before pytest registers the plugin, hence PYTEST_DONT_REWRITE: the asserts in this module
carry their own messages.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from lockgate.machine.tools.notes import NotesSource
from lockgate.simulation.ports import free_port
from tests.support.process_env import lockgate_env

#: The console script installed next to the interpreter running the tests (.venv/bin).
LOCKGATE = Path(sys.executable).with_name("lockgate")
#: Both protocol eras: 2025 sessions, and the stateless 2026-07-28 protocol.
MODES = ["legacy", "2026-07-28"]
DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
#: A server must be ready (or a command finish) within this many seconds.
START_TIMEOUT = 60.0
KEY_PATTERN = re.compile(r"\blg_[A-Za-z0-9_-]{20,}")

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run one async scenario to its end (each test owns its event loop)."""
    return asyncio.run(coroutine)


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


# -- one server process ----------------------------------------------------------------------


@dataclass
class LockgateServer:
    name: str
    port: int
    popen: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path
    instance_id: str | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/mcp"

    def stdout(self) -> str:
        return self.stdout_path.read_text(encoding="utf-8", errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def output(self) -> str:
        return f"--- stdout ---\n{self.stdout()}\n--- stderr ---\n{self.stderr()}"

    def printed_keys(self) -> list[str]:
        """Every distinct API key the process printed (the banner shows a new one once)."""
        return list(dict.fromkeys(KEY_PATTERN.findall(self.stdout())))

    def log_lines(self) -> list[str]:
        """Complete lines only: the process may be writing the last one right now."""
        text = self.stderr()
        lines = text.split("\n")[:-1]  # whatever follows the last newline is incomplete
        return [line for line in lines if line.strip()]

    def log_records(self) -> list[dict[str, Any]]:
        """The structured log: every stderr line must be one JSON object."""
        records = []
        for line in self.log_lines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                pytest.fail(f"server {self.name} logged a line that is not JSON: {line!r}")
            assert isinstance(record, dict), line
            records.append(record)
        return records

    def exited(self) -> int | None:
        return self.popen.poll()

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Poll /readyz until it answers 200; fail early if the process died."""
        deadline = time.monotonic() + timeout
        with httpx2.Client(timeout=2.0) as http:
            while True:
                code = self.exited()
                if code is not None:
                    pytest.fail(
                        f"server {self.name} exited ({code}) before ready:\n{self.output()}"
                    )
                try:
                    response = http.get(f"{self.base_url}/readyz")
                except httpx2.TransportError:
                    response = None
                if response is not None and response.status_code == 200:
                    self.instance_id = response.json()["instance"]
                    return
                if time.monotonic() > deadline:
                    self.kill()
                    pytest.fail(f"server {self.name} not ready in {timeout:g} s:\n{self.output()}")
                time.sleep(0.05)

    def wait_exit(self, timeout: float = START_TIMEOUT) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            pytest.fail(f"server {self.name} did not exit in {timeout:g} s:\n{self.output()}")

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM (a graceful stop) and its exit code."""
        if self.exited() is None:
            self.popen.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def kill(self) -> int:
        """SIGKILL: the process gets no chance to clean up."""
        if self.exited() is None:
            self.popen.send_signal(signal.SIGKILL)
        return self.popen.wait(timeout=30)


# -- one database, the servers and commands on it -------------------------------------------


@dataclass(frozen=True)
class Key:
    id: str
    principal: str
    secret: str


@dataclass
class Command:
    """A running `lockgate` command."""

    popen: subprocess.Popen[str]

    def finish(self, timeout: float = START_TIMEOUT) -> subprocess.CompletedProcess[str]:
        try:
            stdout, stderr = self.popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.communicate()
            pytest.fail(f"{self.popen.args!r} did not finish in {timeout:g} s")
        return subprocess.CompletedProcess(self.popen.args, self.popen.returncode, stdout, stderr)

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

    def env(self, overrides: dict[str, str]) -> dict[str, str]:
        env = lockgate_env(self.database_url, self.notes_dir, LOCKGATE_MAX_DURATION_SECS="20")
        env.update(self.settings)
        env.update(overrides)
        if any(v in env for v in ("LOCKGATE_CRASH_AT", "LOCKGATE_STOP_AT")):
            env.setdefault("LOCKGATE_FAULT_INJECTION", "1")  # obeyed only when switched on
        return env

    def spawn(self, *args: str, name: str | None = None, **env: str) -> LockgateServer:
        """Start `lockgate serve --port <free port> [args]` without waiting for it."""
        name = name or f"server-{len(self.servers)}"
        port = free_port()
        stdout_path = self.logs_dir / f"{name}.stdout"
        stderr_path = self.logs_dir / f"{name}.stderr"
        with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
            popen = subprocess.Popen(
                [str(LOCKGATE), "serve", "--port", str(port), *args],
                cwd=self.logs_dir,
                env=self.env(env),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
            )
        server = LockgateServer(name, port, popen, stdout_path, stderr_path)
        self.servers.append(server)
        return server

    def start(self, *args: str, name: str | None = None, **env: str) -> LockgateServer:
        """Start a server and wait until /readyz answers 200."""
        server = self.spawn(*args, name=name, **env)
        server.wait_ready()
        return server

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """Run a `lockgate` command on this deployment's database."""
        return self.cli_start(*args, **env).finish()

    def cli_start(self, *args: str, **env: str) -> Command:
        """Start a `lockgate` command; `finish()` waits for it (others may run meanwhile)."""
        popen = subprocess.Popen(
            [str(LOCKGATE), *args],
            cwd=self.logs_dir,
            env=self.env(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return Command(popen)

    def create_key(self, principal: str) -> Key:
        """`lockgate keys create <principal>`: the key it prints, once."""
        return self.cli_start("keys", "create", principal).key(principal)

    def revoke_key(self, key_id: str) -> None:
        done = self.cli("keys", "revoke", key_id)
        assert done.returncode == 0, done.stderr
        assert f"revoked {key_id}" in done.stdout

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


# -- MCP clients -----------------------------------------------------------------------------


@asynccontextmanager
async def mcp_client(url: str, key: str | None, mode: str) -> AsyncIterator[Client]:
    """The real SDK client over streamable HTTP, with a Bearer key (or none)."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    finished = False
    try:
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30.0) as http,
            Client(streamable_http_client(url, http_client=http), mode=mode) as client,
        ):
            yield client
            finished = True
    except BaseExceptionGroup as group:
        # The SDK client (mcp 2.3.0) sometimes fails its own teardown after a server was
        # killed under one of its streams: a request task exits an anyio cancel scope from
        # the wrong task. That happens after the test's body has run to the end, in code
        # we do not own; anything else, or anything before the end, still fails the test.
        if not finished or not _only_sdk_teardown_bug(group):
            raise


def _only_sdk_teardown_bug(group: BaseExceptionGroup) -> bool:
    def leaves(exc: BaseException) -> list[BaseException]:
        if isinstance(exc, BaseExceptionGroup):
            return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
        return [exc]

    return all(
        isinstance(leaf, RuntimeError) and "cancel scope" in str(leaf) for leaf in leaves(group)
    )


@dataclass
class SharedServer:
    """A server shared by many tests, with two principals' keys."""

    deployment: Deployment
    server: LockgateServer
    alice: str
    bob: str

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def base_url(self) -> str:
        return self.server.base_url


@dataclass
class Fleet:
    shared: SharedServer
    short: SharedServer
    #: A key of the shared server made with `lockgate keys create carol` (for revocation).
    carol: Key


def create_key_directly(database_url: str, principal: str) -> str:
    """An API key written straight to the database (fast set-up; the CLI is tested apart)."""
    from lockgate.machine.db.migrate import prepare_database
    from lockgate.machine.db.store import SqlStore
    from lockgate.machine.settings import Settings
    from lockgate.server.keys import ApiKeys

    engine = prepare_database(Settings(database_url=database_url))
    try:
        return ApiKeys(SqlStore(engine)).create(principal).secret
    finally:
        engine.dispose()


#: The shared server keeps small limits so the bad-input tests stay cheap.
SHARED_SETTINGS = {"LOCKGATE_MAX_CODE_CHARS": "2000", "LOCKGATE_MAX_REQUEST_BYTES": "65536"}
#: The short server answers `running` after 0.2 s and lets approvals expire after 1 s.
SHORT_SETTINGS = {"LOCKGATE_WAIT_BUDGET_SECS": "0.2", "LOCKGATE_APPROVAL_TTL": "1"}


@pytest.fixture(name="fleet", scope="session", params=DATABASES)
def fleet_fixture(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """Two servers per database kind for the whole session, started side by side."""
    kind: str = request.param
    deployments: list[Deployment] = []
    carol: Command | None = None
    try:
        started = []
        for name, settings in (("shared", SHARED_SETTINGS), ("short", SHORT_SETTINGS)):
            directory = tmp_path_factory.mktemp(f"{name}-{kind}")
            deployment = make_deployment(
                new_database_url(request, kind, directory),
                directory,
                LOCKGATE_INSTANCE_NAME=f"{name}-{uuid.uuid4().hex[:6]}",
                **settings,
            )
            deployments.append(deployment)
            alice = create_key_directly(deployment.database_url, "alice")
            bob = create_key_directly(deployment.database_url, "bob")
            started.append((deployment, deployment.spawn(name=name), alice, bob))
        # The CLI on the (already migrated) database, while the servers boot.
        carol = deployments[0].cli_start("keys", "create", "carol")
        made = carol.key("carol")
        for _, server, _, _ in started:
            server.wait_ready()
        shared, short = (SharedServer(*entry) for entry in started)
        yield Fleet(shared, short, made)
    finally:
        if carol is not None and carol.popen.returncode is None:
            carol.popen.kill()
            carol.popen.communicate()
        for deployment in deployments:
            deployment.stop_all()


@pytest.fixture(name="shared")
def shared_fixture(fleet: Fleet) -> SharedServer:
    return fleet.shared


@pytest.fixture(name="short")
def short_fixture(fleet: Fleet) -> SharedServer:
    return fleet.short


@pytest.fixture(name="deployment")
def deployment_fixture(database_url: str, tmp_path: Path) -> Iterator[Deployment]:
    """A fresh database of each kind for tests that start and kill their own servers."""
    made = make_deployment(
        database_url,
        tmp_path,
        LOCKGATE_LEASE_TTL="1",
        LOCKGATE_HEARTBEAT_INTERVAL="0.2",
    )
    try:
        yield made
    finally:
        made.stop_all()


# -- what the tests run ----------------------------------------------------------------------


def write_code(key: str, text: str = "v") -> str:
    """Agent code whose one call (a write) needs approval; a refusal is caught by the code."""
    return (
        "import tools\n"
        "try:\n"
        f"    outcome = {{'written': tools.notes.write(key={key!r}, text={text!r})}}\n"
        "except PermissionError as exc:\n"
        "    outcome = {'refused': str(exc)}\n"
        "outcome\n"
    )


def unique_key() -> str:
    return f"note-{uuid.uuid4().hex[:10]}"


def structured(result: Any) -> dict[str, Any]:
    content = result.structured_content
    assert isinstance(content, dict), f"no structuredContent in {result!r}"
    return content


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


async def pause(client: Client, key: str) -> dict[str, Any]:
    """Execute a write, which must pause for approval; the paused shape."""
    result = await client.call_tool("execute", {"code": write_code(key)})
    paused = structured(result)
    assert not result.is_error, paused
    assert paused["status"] == "waiting_for_interaction", paused
    return paused


async def settle(client: Client, execution_id: str, timeout: float = 30.0) -> Any:
    """`resume` without an action until the execution is no longer `running`. Each call waits
    up to the server's budget, so this polls without sleeping."""
    deadline = time.monotonic() + timeout
    while True:
        result = await client.call_tool("resume", {"executionId": execution_id})
        if structured(result)["status"] != "running":
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"execution {execution_id} still running after {timeout:g} s")


def writes_of(deployment: Deployment, key: str) -> list[dict[str, Any]]:
    return [e for e in deployment.effects() if e["tool"] == "notes.write" and e["key"] == key]


# -- raw HTTP, for what a well-behaved client never sends -------------------------------------

ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
MODERN = "2026-07-28"
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}


def rpc_body(response: httpx2.Response) -> Any:
    """The JSON-RPC message of a response, whether sent as JSON or as an SSE event."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        data = [
            line[len("data:") :].strip()
            for line in response.text.splitlines()
            if line.startswith("data:") and line[len("data:") :].strip()
        ]
        assert data, f"no SSE data event in {response.text!r}"
        return json.loads(data[-1])
    return response.json()


class RawMCP:
    """Hand-built JSON-RPC POSTs to /mcp, in either protocol era.

    Legacy: one `initialize` (its session id is reused); modern: the `_meta` and the
    `Mcp-Method`/`Mcp-Name` headers the 2026-07-28 protocol requires.
    """

    def __init__(self, http: httpx2.Client, url: str, key: str | None, mode: str) -> None:
        self.http, self.url, self.mode = http, url, mode
        self.auth = {"Authorization": f"Bearer {key}"} if key is not None else {}
        self.session_id: str | None = None
        self._ids = 0

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def initialize(self) -> httpx2.Response:
        response = self.http.post(
            self.url,
            headers={**self.auth, **ACCEPT},
            json={
                "jsonrpc": "2.0",
                "id": self.next_id(),
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "raw-test", "version": "1"},
                },
            },
        )
        if response.status_code == 200:
            self.session_id = response.headers["mcp-session-id"]
            done = self.http.post(
                self.url,
                headers=self.headers("notifications/initialized"),
                json={"jsonrpc": "2.0", "method": "notifications/initialized"},
            )
            assert done.status_code == 202, done.text
        return response

    def headers(self, method: str, name: str | None = None) -> dict[str, str]:
        headers = {**self.auth, **ACCEPT}
        if self.mode == MODERN:
            headers.update({"MCP-Protocol-Version": MODERN, "Mcp-Method": method})
            if name is not None:
                headers["Mcp-Name"] = name
        else:
            if self.session_id is None and method != "initialize":
                self.initialize()
            if self.session_id is not None:
                headers["Mcp-Session-Id"] = self.session_id
            headers["MCP-Protocol-Version"] = "2025-11-25"
        return headers

    def request(self, method: str, params: dict[str, Any] | None = None) -> httpx2.Response:
        params = dict(params or {})
        if self.mode == MODERN:
            params["_meta"] = MODERN_META
        name = params.get("name") if method == "tools/call" else None
        return self.http.post(
            self.url,
            headers=self.headers(method, name),
            json={"jsonrpc": "2.0", "id": self.next_id(), "method": method, "params": params},
        )

    def call_tool(self, name: str, arguments: Any) -> httpx2.Response:
        return self.request("tools/call", {"name": name, "arguments": arguments})

    def post_raw(self, content: bytes, method: str = "tools/list") -> httpx2.Response:
        return self.http.post(self.url, headers=self.headers(method), content=content)
