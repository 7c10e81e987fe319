"""The README's first run works as written: a fresh `lockgate serve`, default settings, no
secret configured, prints the agent's API key and, apart from it, a passkey enrolment link for
the person who approves ("Local operator", of principal `local`). That person registers a
passkey with the link and approves a `tools.notes.write` on the approval page, and the note is
written; the agent's own accept is refused (the default approval mode is `native`), and so is
its approval link used as a credential: a link names a call, it authorises nothing.

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
from lockgate.simulation.passkey_authenticator import SoftAuthenticator
from lockgate.simulation.ports import free_port
from lockgate.spec import ExecutionStatus
from tests.support.people import ENROLMENT_LINK, enrol_with_passkey
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
    # The key the banner printed once is the only set-up the README asks for, and the
    # enrolment link printed beside it is the person's.
    [key] = fresh.printed_keys()
    banner = fresh.stdout()
    assert "A person approves the agent's calls, not its key." in banner, banner
    assert "No approver exists" not in banner, banner
    [link] = list(ENROLMENT_LINK.finditer(banner))
    people_url = link.group(0).split("/enrol/", 1)[0]
    assert people_url == f"http://localhost:{fresh.port}", banner
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
    assert url == f"{people_url}/approve/{execution_id}/1", url
    api = f"{fresh.base_url}/api/executions/{execution_id}/resume"
    with httpx2.Client(timeout=30) as http:
        # The agent's key cannot accept through the HTTP API either...
        by_key = http.post(
            api, headers={"Authorization": f"Bearer {key}"}, json={"action": "accept"}
        )
        assert by_key.status_code == 403, by_key.text
        assert by_key.json()["error"]["code"] == "forbidden"
        # ... nor can its link, which asks whoever opens it to sign in.
        by_link = http.post(
            api,
            headers={"X-Approval-Token": url.rsplit("/approve/", 1)[1]},
            json={"action": "accept"},
        )
        assert by_link.status_code == 401, by_link.text
        opened = http.get(url)
        assert opened.status_code == 303 and opened.headers["location"].startswith("/signin")

    # The person registers a passkey with the printed link (signed in by it), opens the
    # approval link and approves on the page (what its button sends).
    person = enrol_with_passkey(people_url, link.group(1), SoftAuthenticator())
    try:
        page = person.get(url.removeprefix(people_url))
        assert page.status_code == 200 and "Approve" in page.text, page.text
        approved = person.approve(url)
        assert approved.status_code == 200, approved.text
    finally:
        person.close()

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
    # The audit record names the person, and how they signed in.
    exported = subprocess.run(
        [str(LOCKGATE), "audit", "export"],
        cwd=tmp_path,
        env=first_run_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert exported.returncode == 0, exported.stderr
    [record] = [json.loads(line) for line in exported.stdout.splitlines()]
    assert (record["door"], record["actor"]) == ("approval_page", "Local operator"), record
    assert record["by"] == "person" and record["person"]["signedInWith"] == "passkey", record


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
