"""What a real `lockgate serve` writes to stderr: JSON lines when stderr is not a terminal (or
when asked), readable lines on a terminal (or when asked), and routine bookkeeping (lease
heartbeats, a session's per-request begin and end, an answered request) below info, so the
transitions an operator looks for are not drowned in them. No line carries the secret of a
link in a request's path (an enrolment link's, a sign-in's code and state; a served log's
lines are checked for it in test_people_passkeys).
"""

from __future__ import annotations

import json
import logging
import os
import pty
import re
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import func
from sqlmodel import Session
from sqlmodel import select as sql_select

from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.schema import TransitionLog
from lockgate.server import operations
from lockgate.simulation.ports import free_port
from tests.support.canary import CANARY
from tests.support.polling import wait_for
from tests.support.servers import (
    LOCKGATE,
    START_TIMEOUT,
    Deployment,
    LockgateServer,
    mcp_client,
    pause,
    run,
    structured,
    unique_key,
)

pytest_plugins = ["tests.support.servers"]

#: Heartbeats the server must have made before its log is judged (the deployment fixture
#: beats every 0.2 s).
HEARTBEATS = 5
#: `2026-12-01 16:38:41.123 INFO     lockgate.transitions: execution 9c84...: start ...`
TEXT_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} "
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) +(?P<logger>[\w.]+): (?P<message>.*)$"
)
#: Routine bookkeeping: logged at debug, so never at the default (info) level.
ROUTINE = re.compile(
    r"^(instance \S+: heartbeat |session \S+: (begin|end)_request |owed_request \S+: answer )"
)


def heartbeats(database_url: str, instance_id: str) -> int:
    """Heartbeat transitions this instance committed (the transition log is the witness: a
    heartbeat logged at debug leaves no line to count)."""
    engine = open_engine(database_url)
    try:
        with Session(engine) as s:
            count = s.exec(
                sql_select(func.count())
                .select_from(TransitionLog)
                .where(TransitionLog.machine == "instance")
                .where(TransitionLog.record_id == instance_id)
                .where(TransitionLog.event == "heartbeat")
            ).one()
            return int(count)
    finally:
        engine.dispose()


def wait_for_heartbeats(deployment: Deployment, server: LockgateServer) -> None:
    assert server.instance_id is not None
    instance_id = server.instance_id
    wait_for(
        lambda: heartbeats(deployment.database_url, instance_id) >= HEARTBEATS,
        f"{HEARTBEATS} heartbeats of {server.name}",
    )


def an_approved_write(server: LockgateServer, key: str) -> str:
    """One session, an execution paused and accepted: requests, session bookkeeping and
    execution transitions to log. Its id."""

    async def scenario() -> str:
        async with mcp_client(server.url, key, "legacy") as client:
            paused = await pause(client, unique_key())
            done = await client.call_tool(
                "resume", {"executionId": paused["executionId"], "action": "accept"}
            )
            assert structured(done)["status"] == "completed", structured(done)
            return str(paused["executionId"])

    return run(scenario())


def test_heartbeats_are_not_logged_at_info_and_lines_are_json_off_a_terminal(
    deployment: Deployment,
) -> None:
    # stderr is a file: not a terminal, so the default (auto) format is JSON.
    server = deployment.start(name="json")
    [key] = server.printed_keys()
    execution_id = an_approved_write(server, key)
    wait_for_heartbeats(deployment, server)
    records = server.log_records()  # fails on any line that is not one JSON object
    transitions = [r for r in records if r["logger"] == "lockgate.transitions"]
    routine = [r for r in transitions if ROUTINE.match(r["message"])]
    assert not routine, f"routine bookkeeping logged at info: {routine[:3]}"
    for record in records:
        assert {"ts", "level", "logger", "message"} <= set(record), record
        # UTC, to the millisecond: lines from several instances sort into one timeline.
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["ts"]), record
        assert CANARY not in json.dumps(record), "a secret in the environment reached the log"
    # Everything else a transition says is still there, at info.
    named = [r for r in transitions if r.get("execution_id") == execution_id]
    events = {r["message"].split(": ")[-1].split(" ")[0] for r in named}
    assert {"start", "pause", "approve", "resume", "dispatch", "complete"} <= events, events
    assert all(r["level"] == "info" for r in named), named


def text_records(lines: list[str]) -> list[dict[str, str]]:
    records = []
    for line in lines:
        matched = TEXT_LINE.match(line)
        assert matched, f"not a readable log line: {line!r}"
        assert not line.startswith("{"), line
        records.append(matched.groupdict())
    return records


def check_text_log(lines: list[str], execution_id: str) -> None:
    records = text_records(lines)
    transitions = [r for r in records if r["logger"] == "lockgate.transitions"]
    assert not [r for r in transitions if ROUTINE.match(r["message"])], transitions
    mine = [r for r in transitions if execution_id in r["message"]]
    assert mine and all(r["level"] == "INFO" for r in mine), transitions
    assert all(CANARY not in line for line in lines)


def test_text_format_when_asked(deployment: Deployment) -> None:
    server = deployment.start(name="text", LOCKGATE_LOG_FORMAT="text")
    [key] = server.printed_keys()
    execution_id = an_approved_write(server, key)
    wait_for_heartbeats(deployment, server)
    check_text_log(server.log_lines(), execution_id)


def test_json_format_when_asked_even_on_a_terminal(deployment: Deployment) -> None:
    with Terminal(deployment, LOCKGATE_LOG_FORMAT="json") as terminal:
        line = terminal.wait_for_line(lambda text: "Uvicorn running" in text)
        record = json.loads(line)
        assert record["logger"] == "uvicorn.error" and record["level"] == "info", record


def test_readable_lines_on_a_terminal(deployment: Deployment) -> None:
    with Terminal(deployment) as terminal:
        terminal.wait_for_line(lambda text: "Uvicorn running" in text)
        execution_id = an_approved_write(terminal.server, terminal.key())
        terminal.wait_for_line(lambda text: f"execution {execution_id}: complete" in text)
        wait_for_heartbeats(deployment, terminal.server)
        check_text_log(terminal.lines(), execution_id)


def test_an_unknown_log_format_is_refused(deployment: Deployment) -> None:
    done = deployment.cli("serve", "--port", str(free_port()), LOCKGATE_LOG_FORMAT="yaml")
    assert done.returncode == 2, done
    assert "invalid configuration" in done.stderr and "'auto', 'text' or 'json'" in done.stderr


# -- a server whose stderr is a terminal --------------------------------------------------------


class Terminal:
    """`lockgate serve` with stderr on a pseudo-terminal (stdout to a file, for the banner).

    A thread drains the terminal all along: a server whose terminal buffer filled up would
    block in its next log call.
    """

    def __init__(self, deployment: Deployment, **env: str) -> None:
        self.deployment, self.env = deployment, env
        self._buffer = b""
        self._lock = threading.Lock()

    def __enter__(self) -> Terminal:
        port = free_port()
        logs = self.deployment.logs_dir
        stdout_path, stderr_path = logs / "tty.stdout", logs / "tty.stderr"
        stderr_path.write_text("(stderr went to a terminal)\n")
        self.master, slave = pty.openpty()
        with open(stdout_path, "wb") as stdout:
            popen = subprocess.Popen(
                [str(LOCKGATE), "serve", "--port", str(port)],
                cwd=logs,
                env=self.deployment.env(self.env),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=slave,
            )
        os.close(slave)  # the child holds it now: its exit ends the reader's reads
        self.server = LockgateServer("tty", port, popen, stdout_path, stderr_path)
        self.deployment.servers.append(self.server)
        self._reader = threading.Thread(target=self._drain, name="tty-reader", daemon=True)
        self._reader.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.terminate()
        self._reader.join(timeout=START_TIMEOUT)
        os.close(self.master)

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every writer (the server) is gone
                return
            if not chunk:
                return
            with self._lock:
                self._buffer += chunk

    def key(self) -> str:
        self.server.wait_ready()
        [key] = self.server.printed_keys()
        return key

    def text(self) -> str:
        with self._lock:
            raw = self._buffer
        return raw.decode("utf-8", errors="replace").replace("\r\n", "\n")

    def lines(self) -> list[str]:
        """Complete lines so far (a terminal ends them with CR LF)."""
        return [line for line in self.text().split("\n")[:-1] if line.strip()]

    def wait_for_line(self, wanted: Callable[[str], bool]) -> str:
        found: list[str] = []

        def seen() -> bool:
            found[:] = [line for line in self.lines() if wanted(line)]
            if not found and self.server.exited() is not None:
                pytest.fail(f"the server exited; its terminal showed:\n{self.text()}")
            return bool(found)

        wait_for(seen, "a line on the terminal", timeout=START_TIMEOUT)
        return found[0]


# -- the formatters, for what a running server rarely shows -----------------------------------


def record_with(message: str, args: tuple[object, ...], exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError(f"boom {CANARY}")
        except ValueError as caught:
            exc_info = (ValueError, caught, caught.__traceback__)
    return logging.LogRecord("lockgate.test", logging.WARNING, __file__, 1, message, args, exc_info)


@pytest.mark.parametrize("name", ["JsonLogFormatter", "TextLogFormatter"])
def test_both_formats_hide_link_secrets_and_log_exceptions_by_type(name: str) -> None:
    """An enrolment link's secret and an OpenID provider's code and state are cut from a
    request's path; an approval page's path stays whole (it names a call, and is no secret)."""
    formatter: logging.Formatter = getattr(operations, name)()
    link_id, execution_id = "a1" * 16, "e2" * 16
    for path, kept in (
        (f"/enrol/{link_id}.abcDEF-123_x", f"/enrol/{link_id}."),
        ("/signin/oidc/callback?state=st4te-x&code=c0de-y", "/signin/oidc/callback?state="),
        (f"/approve/{execution_id}/1", f"/approve/{execution_id}/1"),
    ):
        record = record_with('%s - "%s %s HTTP/1.1" %d', ("127.0.0.1:5", "GET", path, 200))
        line = formatter.format(record)
        assert kept in line, line
        for secret in ("abcDEF-123_x", "st4te-x", "c0de-y"):
            assert secret not in line, line
    line = formatter.format(record_with("tool failed", (), exc=True))
    assert "ValueError" in line
    assert CANARY not in line and "Traceback" not in line and "\n" not in line


def test_text_lines_name_their_execution_and_session() -> None:
    record = record_with("resumed", ())
    record.execution_id = "ex123"
    record.session_id = "se456"
    line = operations.TextLogFormatter().format(record)
    matched = TEXT_LINE.match(line)
    assert matched and matched["level"] == "WARNING" and matched["logger"] == "lockgate.test"
    assert line.endswith("resumed [execution_id=ex123 session_id=se456]"), line


def test_the_reference_table_lists_the_log_format(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(LOCKGATE), "settings"], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert "| `LOCKGATE_LOG_FORMAT` | `auto` |" in done.stdout
