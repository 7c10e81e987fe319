"""The secret store: values encrypted at rest under LOCKGATE_SECRETS_KEY, global or one
principal's, usable by any source or bound to one, resolved only at dispatch after approval,
never in a row, a log, a result or a listing; rotatable; a server holding secrets it cannot
decrypt refuses to start.

Two principals throughout: each one's calls carry its own credential, never the other's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from lockgate.machine.db.audit_queries import AuditQueries
from lockgate.machine.db.migrate import prepare_database
from lockgate.machine.db.store import SqlStore
from lockgate.machine.engine import Action
from lockgate.machine.runtime import Runtime
from lockgate.machine.secret_store import (
    InvalidSecret,
    SecretCipher,
    SecretKeyProblem,
    StoredSecrets,
    new_key,
)
from lockgate.machine.secrets import REDACTED, MissingSecret
from lockgate.machine.settings import Settings
from lockgate.server import cli
from lockgate.spec import ExecutionStatus
from tests.support.engine_records import MakeRuntime, caught
from tests.support.http_api import ItemsApi, RunningApi, serve, sources_file

ALICE_TOKEN = "alice-token-7f3a9c1e5b"
BOB_TOKEN = "bob-token-2d8e4f6a0c"
GLOBAL_TOKEN = "global-token-9b1c3e5d7f"
KEY_A, KEY_B = new_key(), new_key()


@pytest.fixture(name="api")
def api_fixture() -> Iterator[RunningApi]:
    yield from serve(ItemsApi())


def items_runtime(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi, **settings: Any
) -> Runtime:
    path = sources_file(tmp_path, api, auth='{ bearer = "items_token" }')
    # secrets=None: the server's own store, as `lockgate serve` builds it.
    return make_runtime(sources_file=path, secrets=None, **settings)


def store_of(runtime: Runtime, *keys: str) -> StoredSecrets:
    return StoredSecrets(runtime.engine.store.secrets, SecretCipher(list(keys or [KEY_A])))


def test_each_principal_s_calls_carry_its_own_secret_and_nothing_keeps_a_value(
    make_runtime: MakeRuntime,
    tmp_path: Path,
    api: RunningApi,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rt = items_runtime(make_runtime, tmp_path, api, secrets_key=KEY_A)
    secrets = store_of(rt)
    assert secrets.set("items_token", GLOBAL_TOKEN) is True
    assert secrets.set("items_token", ALICE_TOKEN, principal="alice") is True
    caplog.set_level(logging.DEBUG)

    for principal in ("alice", "bob", "carol"):
        done = rt.engine.execute(principal, "tools.items.whoami()")
        assert done.status is ExecutionStatus.COMPLETED, done.error
        # The API echoed the credential; what Lockgate kept is its redaction.
        assert done.result == {"authorization": f"Bearer {REDACTED}", "api_key": None}
    # alice's own secret shadows the global one; the others get the global one.
    assert api.api.credentials == [
        f"Bearer {ALICE_TOKEN}",
        f"Bearer {GLOBAL_TOKEN}",
        f"Bearer {GLOBAL_TOKEN}",
    ]
    # bob's own, set later, replaces nothing of alice's.
    assert secrets.set("items_token", BOB_TOKEN, principal="bob") is True
    rt.engine.execute("bob", "tools.items.whoami()")
    assert api.api.credentials[-1] == f"Bearer {BOB_TOKEN}"

    kept = "\n".join(text for _, text in AuditQueries(rt.engine.store.engine).stored_text())
    logged = caplog.text
    for value in (ALICE_TOKEN, BOB_TOKEN, GLOBAL_TOKEN):
        assert value not in kept and value not in logged
    assert "secrets" in {table for table, _ in AuditQueries(rt.engine.store.engine).stored_text()}


def test_a_gated_call_reads_its_secret_only_after_the_approval(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    rt = items_runtime(make_runtime, tmp_path, api, secrets_key=KEY_A)
    secrets = store_of(rt)
    code = 'tools.items.create_item(body={"name": "pen", "price": 1.0})'
    # No secret yet: the call still pauses (nothing is resolved before the decision) ...
    paused = rt.engine.execute("alice", code)
    assert paused.status is ExecutionStatus.WAITING_FOR_INTERACTION
    # ... and the one stored while it waited is the one sent.
    secrets.set("items_token", ALICE_TOKEN, principal="alice")
    done = rt.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert api.api.effects == [{"created": 1}]


def test_a_secret_bound_to_another_source_is_not_given_to_this_one(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    rt = items_runtime(make_runtime, tmp_path, api, secrets_key=KEY_A)
    store_of(rt).set("items_token", GLOBAL_TOKEN, source="billing")
    done = rt.engine.execute("alice", caught("tools.items.whoami()"))
    assert (
        done.result
        == "RuntimeError: tools.items.whoami failed: secret 'items_token' not configured"
    )
    assert api.api.credentials == []
    store_of(rt).set("items_token", GLOBAL_TOKEN, source="items")  # rebound to this source
    rt.engine.execute("alice", "tools.items.whoami()")
    assert api.api.credentials == [f"Bearer {GLOBAL_TOKEN}"]


def test_rotation_re_encrypts_under_the_new_key_and_the_old_one_can_go(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    rt = items_runtime(make_runtime, tmp_path, api, secrets_key=KEY_A)
    store_of(rt, KEY_A).set("items_token", GLOBAL_TOKEN)
    before = rt.engine.store.secrets.all()[0].ciphertext
    assert GLOBAL_TOKEN.encode() not in before

    assert store_of(rt, KEY_B, KEY_A).rotate() == 1
    assert rt.engine.store.secrets.all()[0].ciphertext != before
    assert store_of(rt, KEY_B).resolve(["items_token"]) == {"items_token": GLOBAL_TOKEN}
    with pytest.raises(SecretKeyProblem, match="cannot be decrypted"):
        store_of(rt, KEY_A).resolve(["items_token"])


def test_a_server_holding_secrets_refuses_to_start_without_the_key(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    rt = items_runtime(make_runtime, tmp_path, api, secrets_key=KEY_A)
    store_of(rt).set("items_token", GLOBAL_TOKEN)
    with pytest.raises(SecretKeyProblem, match="LOCKGATE_SECRETS_KEY is not set"):
        items_runtime(make_runtime, tmp_path, api)
    with pytest.raises(SecretKeyProblem, match="entry 1 of LOCKGATE_SECRETS_KEY is not a key"):
        items_runtime(make_runtime, tmp_path, api, secrets_key="not-a-key")


def test_nothing_can_be_stored_without_a_key(tmp_path: Path) -> None:
    store = SqlStore(prepare_database(Settings(database_url=f"sqlite:///{tmp_path / 'x.db'}")))
    with pytest.raises(SecretKeyProblem, match="cannot be stored unencrypted"):
        StoredSecrets(store.secrets, None).set("t", "v")
    assert store.secrets.any() is False
    # Nothing stored: the environment still answers, as before the store existed.
    with pytest.raises(MissingSecret, match="'absent' not configured"):
        StoredSecrets(store.secrets, None).resolve(["absent"])


# -- the operator's commands ---------------------------------------------------------------------


def test_secrets_commands_never_print_a_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'x.db'}")
    monkeypatch.delenv("LOCKGATE_SECRETS_KEY", raising=False)
    refused = runner.invoke(cli.app, ["secrets", "set", "tok"], input=ALICE_TOKEN)
    assert refused.exit_code == 2 and "cannot be stored unencrypted" in refused.output
    assert "Traceback" not in refused.output

    key = runner.invoke(cli.app, ["secrets", "key"]).output.strip()
    monkeypatch.setenv("LOCKGATE_SECRETS_KEY", key)
    made = runner.invoke(
        cli.app, ["secrets", "set", "tok", "--principal", "alice", "--source", "items"],
        input=ALICE_TOKEN + "\n",
    )  # fmt: skip
    assert made.exit_code == 0 and "stored secret tok (alice, source items)" in made.output
    again = runner.invoke(cli.app, ["secrets", "set", "tok", "--principal", "alice"], input="x1y2")
    assert again.exit_code == 0 and "replaced secret tok" in again.output
    listed = runner.invoke(cli.app, ["secrets", "list"])
    assert listed.exit_code == 0 and "tok" in listed.output and "alice" in listed.output
    for output in (made.output, again.output, listed.output):
        assert ALICE_TOKEN not in output and "x1y2" not in output

    missing = runner.invoke(cli.app, ["secrets", "delete", "tok"])  # the global one: none
    assert missing.exit_code == 1 and "lockgate secrets list" in missing.output
    gone = runner.invoke(cli.app, ["secrets", "delete", "tok", "--principal", "alice"])
    assert gone.exit_code == 0 and "deleted secret tok" in gone.output
    rotated = runner.invoke(cli.app, ["secrets", "rotate"])
    assert rotated.exit_code == 0 and "re-encrypted 0 secrets" in rotated.output

    # A secret stored, then a server started without the key: it refuses, in one line.
    runner.invoke(cli.app, ["secrets", "set", "tok"], input=GLOBAL_TOKEN)
    monkeypatch.delenv("LOCKGATE_SECRETS_KEY")
    monkeypatch.setenv("LOCKGATE_NOTES_DIR", str(tmp_path / "notes"))
    # `serve` configures the process's logging (the root logger's handlers and level) before
    # it refuses; put them back, or later tests in this worker log into a closed stream.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        served = runner.invoke(cli.app, ["serve", "--port", "9"])
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    assert served.exit_code == 2, served.output
    assert (
        "cannot start: secrets are stored in the database but LOCKGATE_SECRETS_KEY is not set"
        in (served.output)
    )


@pytest.mark.parametrize(
    ("name", "value", "source", "problem"),
    [
        ("a" * 201, "v", None, "is not a secret name"),
        ("has space", "v", None, "is not a secret name"),
        ("tok", "", None, "is empty"),
        ("tok", "x" * (64 * 1024 + 1), None, "is over 65536 bytes"),
        ("tok", "v", "not-a-source", "is not a source name"),
        ("tok", "v", "s" * 201, "is not a source name"),
    ],
)
def test_a_secret_the_store_cannot_keep_is_refused_in_words(
    make_runtime: MakeRuntime,
    tmp_path: Path,
    api: RunningApi,
    name: str,
    value: str,
    source: str | None,
    problem: str,
) -> None:
    rt = items_runtime(make_runtime, tmp_path, api, secrets_key=KEY_A)
    with pytest.raises(InvalidSecret, match=problem):
        store_of(rt).set(name, value, source=source)
    assert rt.engine.store.secrets.all() == []
