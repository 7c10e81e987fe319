"""Servers and commands forked warm (`simulation/warm_start.py`) are processes of their own,
seen as `subprocess.Popen` sees one (their output, exit code, pid and signals), and
`LOCKGATE_COLD_START=1` starts them with exec instead, seen the same way."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from lockgate.simulation import warm_start
from lockgate.simulation.ports import free_port
from tests.support.lockgate_server import LockgateServer
from tests.support.process_env import lockgate_env


@pytest.fixture(name="start", params=["warm", "cold"])
def start_fixture(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test twice: forked warm, then with `LOCKGATE_COLD_START=1` (exec)."""
    if request.param == "cold":
        monkeypatch.setenv(warm_start.COLD_START, "1")
    return str(request.param)


@pytest.fixture(name="env")
def env_fixture(tmp_path: Path) -> dict[str, str]:
    return lockgate_env(f"sqlite:///{tmp_path / 'lockgate.db'}", tmp_path / "notes")


def lockgate(
    tmp_path: Path, env: dict[str, str], *args: str, name: str = "command"
) -> tuple[warm_start.ServerPopen, Path, Path]:
    out, err = tmp_path / f"{name}.stdout", tmp_path / f"{name}.stderr"
    started = warm_start.start(
        "lockgate.server.cli", list(args), env=env, cwd=tmp_path, stdout=out, stderr=err
    )
    return started, out, err


@pytest.mark.usefixtures("start")
def test_a_command_s_output_and_exit_status_are_its_own(
    tmp_path: Path, env: dict[str, str]
) -> None:
    created, out, err = lockgate(tmp_path, env, "keys", "create", "alice", name="create")
    assert created.wait(timeout=60) == 0, err.read_text()
    assert "principal: alice" in out.read_text()
    refused, _, err = lockgate(tmp_path, env, "keys", "revoke", "no-such-key", name="revoke")
    assert refused.wait(timeout=60) == 1
    assert "no-such-key" in err.read_text()


@pytest.mark.usefixtures("start")
def test_a_server_is_a_process_of_its_own_stopped_and_killed_by_signals(
    tmp_path: Path, env: dict[str, str]
) -> None:
    servers = []
    for name in ("killed", "stopped"):
        port = free_port()
        popen, out, err = lockgate(tmp_path, env, "serve", "--port", str(port), name=name)
        server = LockgateServer(name, port, popen, out, err)
        server.wait_ready()
        servers.append(server)
    killed, stopped = servers
    assert len({os.getpid(), killed.pid, stopped.pid}) == 3
    assert killed.kill() == -signal.SIGKILL
    assert killed.exited() == -signal.SIGKILL
    assert stopped.exited() is None  # the other one lives on
    assert stopped.terminate() == 0, stopped.output()
    assert "Lockgate MCP server:" in stopped.stdout()
