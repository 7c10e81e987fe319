"""The README's first run works as written: a fresh `lockgate serve`, default settings, no
secret configured, and a `tools.notes.write` approved by a person on the approval page writes
the note; the agent's own accept is refused (the default approval mode is `native`).

And the secret store still does its job for a source that needs a credential: the notes
source given the token it must see (`expected_token`) declares the `notes_token` secret,
gets it from `LOCKGATE_SECRET_NOTES_TOKEN` at dispatch, and fails the call, naming the
secret, when it is not set.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from lockgate.machine.engine import Action
from lockgate.machine.runtime import Runtime
from lockgate.machine.secrets import EnvironmentSecrets, environment_variable
from lockgate.machine.settings import Settings
from lockgate.machine.tools.notes import TOKEN_SECRET, NotesSource
from lockgate.simulation.ports import free_port
from lockgate.spec import ExecutionStatus
from tests.support.servers import (
    LOCKGATE,
    MODES,
    LockgateServer,
    mcp_client,
    pause,
    run,
    structured,
    text_of,
)

pytestmark = pytest.mark.slow


def first_run_env() -> dict[str, str]:
    """The caller's environment without any Lockgate configuration: no LOCKGATE_* (secrets
    included) and no DATABASE_URL, as on a machine that never ran Lockgate."""
    return {
        k: v for k, v in os.environ.items() if not k.startswith("LOCKGATE_") and k != "DATABASE_URL"
    }


@pytest.fixture(name="fresh")
def fresh_fixture(tmp_path: Path) -> Iterator[LockgateServer]:
    """`lockgate serve` as `make run` starts it, in an empty directory (its database and notes
    are the defaults, relative to it). Only the port is chosen, so tests can run side by side."""
    port = free_port()
    stdout_path, stderr_path = tmp_path / "serve.stdout", tmp_path / "serve.stderr"
    env = first_run_env()
    assert not [k for k in env if k.startswith("LOCKGATE_SECRET_")]
    with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
        popen = subprocess.Popen(
            [str(LOCKGATE), "serve", "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
        )
    server = LockgateServer("fresh", port, popen, stdout_path, stderr_path)
    try:
        server.wait_ready()
        yield server
    finally:
        server.terminate()


@pytest.mark.parametrize("mode", MODES)
def test_an_approved_note_write_works_on_a_fresh_server(
    fresh: LockgateServer, tmp_path: Path, mode: str
) -> None:
    # The key the banner printed once is the only set-up the README asks for.
    [key] = fresh.printed_keys()
    note = f"first-run-{mode}"

    async def ask() -> dict[str, Any]:
        async with mcp_client(fresh.url, key, mode) as client:
            paused = await pause(client, note)
            # By default a person approves: the agent's own accept is refused, in words.
            refused = await client.call_tool(
                "resume", {"executionId": paused["executionId"], "action": "accept"}
            )
            assert refused.is_error, structured(refused)
            assert "A person must approve this call" in text_of(refused)
            assert paused["interaction"]["approvalUrl"] in text_of(refused)
            return paused

    paused = run(ask())
    execution_id = str(paused["executionId"])
    url = str(paused["interaction"]["approvalUrl"])
    # The agent's key cannot accept through the HTTP API either.
    api = f"{fresh.base_url}/api/executions/{execution_id}/resume"
    with httpx2.Client(timeout=30) as http:
        by_key = http.post(
            api, headers={"Authorization": f"Bearer {key}"}, json={"action": "accept"}
        )
        assert by_key.status_code == 403, by_key.text
        assert by_key.json()["error"]["code"] == "forbidden"
        # The person opens the link and approves on the page (what its button sends).
        page = http.get(url)
        assert page.status_code == 200 and "Approve" in page.text
        approved = http.post(
            api,
            headers={"X-Approval-Token": url.rsplit("/", 1)[1], "Origin": fresh.base_url},
            json={"action": "accept"},
        )
        assert approved.status_code == 200, approved.text

    async def collect() -> dict[str, Any]:
        async with mcp_client(fresh.url, key, mode) as client:
            done = await client.call_tool("resume", {"executionId": execution_id})
            assert not done.is_error, structured(done)
            return structured(done)

    body = run(collect())
    assert body["status"] == "completed", body
    assert body["result"] == {"written": {"key": note, "written": True}}, body
    # Written where the default settings say, by the demo source itself.
    stored = json.loads((tmp_path / "lockgate-notes" / "notes.json").read_text())
    assert stored[note] == "v"


# -- a source that needs a secret, through the real secret store ---------------------------

TOKEN = "first-run-token-0123456789"
WRITE = "tools.notes.write(key='k', text='x')"


def credentialed_runtime(tmp_path: Path, environ: dict[str, str]) -> Runtime:
    runtime = Runtime.create(
        Settings(database_url=f"sqlite:///{tmp_path / 'lockgate.db'}", notes_dir=None),
        sources=[NotesSource(tmp_path / "notes", expected_token=TOKEN)],
        secrets=EnvironmentSecrets(environ=environ),
    )
    runtime.start(background=False)
    return runtime


def close(runtime: Runtime) -> None:
    runtime.close()
    runtime.engine.store.engine.dispose()


def test_a_source_that_needs_its_secret_gets_it_from_the_environment(tmp_path: Path) -> None:
    variable = environment_variable(TOKEN_SECRET)
    assert variable == "LOCKGATE_SECRET_NOTES_TOKEN"
    runtime = credentialed_runtime(tmp_path, {variable: TOKEN})
    try:
        paused = runtime.engine.execute("alice", WRITE)
        done = runtime.engine.resume(paused.id, "alice", Action.ACCEPT)
        assert done.status is ExecutionStatus.COMPLETED, done
        assert done.result == {"key": "k", "written": True}
    finally:
        close(runtime)


def test_a_source_that_needs_its_secret_fails_the_call_naming_it(
    tmp_path: Path,
) -> None:
    runtime = credentialed_runtime(tmp_path, {})
    try:
        paused = runtime.engine.execute("alice", WRITE)
        done = runtime.engine.resume(paused.id, "alice", Action.ACCEPT)
        assert done.status is ExecutionStatus.FAILED, done
        assert done.error is not None
        assert "secret 'notes_token' not configured" in str(done.error), done.error
        assert NotesSource(tmp_path / "notes").effects() == []  # the tool never ran
    finally:
        close(runtime)
