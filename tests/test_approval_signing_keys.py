"""The keys that sign approval links, over real HTTP (the real app, uvicorn, SQLite and
PostgreSQL): a rotated-out key no longer opens its links, instances sharing a key (and a
restarted one) hand out and accept the same link, where the keys come from (a private file
beside a SQLite database, made once however many servers start at once; a key of its own
for in-memory SQLite; LOCKGATE_SIGNING_KEYS, which PostgreSQL requires), that no key is ever
shown, and migration 0007, which drops the plaintext tokens of older links.
"""

from __future__ import annotations

import hashlib
import logging
import stat
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from alembic.command import downgrade
from pydantic import SecretStr, ValidationError
from sqlalchemy import inspect, text

from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.migrate import alembic_config, upgrade
from lockgate.machine.db.store import SqlStore
from lockgate.machine.runtime import Runtime
from lockgate.machine.settings import Settings
from lockgate.machine.settings_reference import reference_table
from lockgate.server.approval_tokens import (
    ApprovalTokens,
    LinkKeys,
    SigningKeyFileInvalid,
    TokenRefused,
    link_keys,
)
from lockgate.server.keys import ApiKeys
from tests.support.approval_app import (
    TWO_WRITES,
    WRITE_NOTE,
    assert_clear_page,
    assert_problem,
    serve,
    token_of,
)
from tests.support.approval_links import (
    NOW,
    decide,
    look_again,
    mcp_calls,
    stored_values,
    tokens_of,
)
from tests.support.servers import listening, make_deployment, new_database_url

OLD_KEY = "old-approval-link-signing-key-0123456789abcdef"
NEW_KEY = "new-approval-link-signing-key-fedcba9876543210"


# -- signed links: a rotated-out key, restarts and other instances -----------------------------


def test_a_rotated_out_key_no_longer_opens_its_links(make_runtime: Callable[..., Runtime]) -> None:
    with serve(make_runtime, signing_keys=OLD_KEY, instance_name="a") as served:
        [answer] = mcp_calls(served, ("execute", {"code": WRITE_NOTE}))
        execution_id, key = answer["executionId"], served.key
        old = token_of(answer["interaction"]["approvalUrl"])

    # Rotation, step 1: the new key signs, the old one still verifies.
    with serve(make_runtime, signing_keys=f"{NEW_KEY},{OLD_KEY}", instance_name="a") as served:
        served = replace(served, key=key)  # the same client: the same link, re-signed
        assert served.get(f"/approve/{old}").status_code == 200
        new = token_of(look_again(served, execution_id)["interaction"]["approvalUrl"])
        assert new != old and new.split("-")[0] == old.split("-")[0]
        assert token_of(look_again(served, execution_id)["interaction"]["approvalUrl"]) == new
        assert served.get(f"/approve/{new}").status_code == 200
        assert len(tokens_of(served, execution_id)) == 1

    # Step 2, once the old links have expired: the old key is dropped, and refused.
    with serve(make_runtime, signing_keys=NEW_KEY, instance_name="a") as served:
        assert_clear_page(served.get(f"/approve/{old}"), 404, "not valid")
        assert_problem(decide(served, execution_id, old, "accept"), 403, "token_unknown")
        assert served.get(f"/approve/{new}").status_code == 200
        done = decide(served, execution_id, new, "accept")
        assert done.status_code == 200 and done.json()["status"] == "completed", done.text


def test_links_work_after_a_restart_and_on_another_instance(
    make_runtime: Callable[..., Runtime], database_url: str
) -> None:
    """Instances sharing the key (the tests' shared key on PostgreSQL, the database's key
    file on SQLite) hand out and accept the same link; an instance with another key, none."""
    with serve(make_runtime, instance_name="a") as a:
        [answer] = mcp_calls(a, ("execute", {"code": TWO_WRITES}))
        execution_id, token = answer["executionId"], token_of(answer["interaction"]["approvalUrl"])
        with serve(make_runtime, instance_name="b") as b:
            b = replace(b, key=a.key)  # the same client, at the other instance
            assert token_of(look_again(b, execution_id)["interaction"]["approvalUrl"]) == token
            assert b.get(f"/approve/{token}").status_code == 200
        if not database_url.startswith("sqlite"):
            with serve(make_runtime, instance_name="c", signing_keys=NEW_KEY) as stranger:
                assert_clear_page(stranger.get(f"/approve/{token}"), 404, "not valid")
    with serve(make_runtime, instance_name="a") as again:  # the restart
        again = replace(again, key=a.key)
        assert token_of(look_again(again, execution_id)["interaction"]["approvalUrl"]) == token
        done = decide(again, execution_id, token, "accept")
        assert done.status_code == 200 and done.json()["status"] == "waiting_for_interaction"
        # The next call gets a link of its own, the next time an answer shows it.
        second = token_of(look_again(again, execution_id)["interaction"]["approvalUrl"])
        assert second != token and again.get(f"/approve/{second}").status_code == 200
        assert len(tokens_of(again, execution_id)) == 2


# -- where the keys come from ----------------------------------------------------------------


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_sqlite_server_keeps_its_key_in_a_private_file(
    make_runtime: Callable[..., Runtime],
    database_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    key_file = tmp_path / "lockgate.db.key"
    assert not key_file.exists()
    caplog.set_level(logging.INFO, logger="lockgate.server")
    with serve(make_runtime, instance_name="a") as served:
        [answer] = mcp_calls(served, ("execute", {"code": WRITE_NOTE}))
        execution_id, token = answer["executionId"], token_of(answer["interaction"]["approvalUrl"])
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_text()
    assert len(key.strip()) >= 32 and key.strip() not in stored_values(served)
    [said] = [r.getMessage() for r in caplog.records if "signed with" in r.getMessage()]
    assert str(key_file) in said and "created now" in said and key.strip() not in said
    caplog.clear()

    with serve(make_runtime, instance_name="a") as served:  # the restart: same file, same key
        [said] = [r.getMessage() for r in caplog.records if "signed with" in r.getMessage()]
        assert str(key_file) in said and "reused" in said
        assert served.get(f"/approve/{token}").status_code == 200
        done = decide(served, execution_id, token, "accept")
        assert done.status_code == 200 and done.json()["status"] == "completed", done.text
    assert key_file.read_text() == key


def test_servers_starting_at_once_on_one_sqlite_file_make_one_key(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'db' / 'x.db'}")
    (tmp_path / "db").mkdir()
    found: list[LinkKeys] = []
    start = threading.Barrier(8)

    def boot() -> None:
        start.wait()
        found.append(link_keys(settings))

    threads = [threading.Thread(target=boot) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({keys.keys for keys in found}) == 1
    assert sum("created now" in keys.origin for keys in found) == 1
    assert sorted(p.name for p in (tmp_path / "db").iterdir()) == ["x.db.key"]  # no leftovers


def test_a_broken_key_file_is_refused_clearly(tmp_path: Path) -> None:
    key_file = tmp_path / "x.db.key"
    key_file.write_text("short\n")
    with pytest.raises(SigningKeyFileInvalid) as refused:
        link_keys(Settings(database_url=f"sqlite:///{tmp_path / 'x.db'}"))
    assert str(key_file) in str(refused.value) and "Delete it" in str(refused.value)


def test_in_memory_sqlite_signs_with_a_key_of_its_own() -> None:
    first, second = (link_keys(Settings(database_url="sqlite://")) for _ in range(2))
    assert first.keys != second.keys and "in-memory" in first.origin


def test_keys_are_never_shown() -> None:
    settings = Settings(signing_keys=SecretStr(f"{NEW_KEY}, {OLD_KEY}"))
    assert settings.signing_secrets == (NEW_KEY.encode(), OLD_KEY.encode())
    keys = link_keys(settings)
    for shown in (repr(settings), str(settings), repr(keys), keys.origin, reference_table()):
        assert NEW_KEY not in shown and OLD_KEY not in shown
    assert Settings(signing_keys=SecretStr(" ")).signing_keys is None  # set to nothing: unset
    with pytest.raises(ValidationError) as refused:
        Settings(signing_keys=SecretStr(f"{NEW_KEY},too-short-a-secret"))
    assert "key 2 has 18 characters" in str(refused.value)
    assert "too-short-a-secret" not in str(refused.value) and NEW_KEY not in str(refused.value)


@pytest.mark.slow
@pytest.mark.postgres
def test_a_postgresql_server_without_keys_refuses_to_start(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    database_url = new_database_url(request, "postgres", tmp_path)
    deployment = make_deployment(database_url, tmp_path, LOCKGATE_SIGNING_KEYS="")
    server = deployment.spawn(name="keyless")
    assert server.wait_exit(timeout=60) == 2, server.output()
    message = server.stderr()
    assert "LOCKGATE_SIGNING_KEYS is not set" in message
    assert "same secret" in message and "every instance" in message
    assert "Traceback" not in message
    assert "Lockgate MCP server:" not in server.stdout() and server.printed_keys() == []
    assert not listening(server.port)
    # Given the key, the same deployment starts.
    deployment.settings["LOCKGATE_SIGNING_KEYS"] = NEW_KEY
    try:
        deployment.start(name="keyed")
    finally:
        deployment.stop_all()


def test_migration_0007_drops_the_plaintext_tokens(database_url: str) -> None:
    """A live 0006 link (its token in plain text) is gone after 0007: the column with it, and
    the link from being handed out; the call's next answer mints a signed one."""
    engine = open_engine(database_url)
    try:
        upgrade(engine)
        downgrade(alembic_config(engine), "0006")
        # The 0006 schema, so by hand: today's model has columns that revision lacks.
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO executions (id, principal_id, status, version, code, "
                    "calls_made, logs, created_at, updated_at) VALUES ('e1', 'alice', "
                    "'pending', 0, '1', 0, '', :now, :now)"
                ),
                {"now": NOW.replace(tzinfo=None)},
            )
        plaintext = "plaintext-token-of-a-0006-link-0123456789ab"
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO approval_tokens (token_hash, execution_id, call_seq, "
                    "principal_id, created_at, expires_at, token, link) VALUES (:h, 'e1', 1, "
                    "'alice', :now, :later, :token, 'e1:1:')"
                ),
                {
                    "h": hashlib.sha256(plaintext.encode()).hexdigest(),
                    "now": NOW.replace(tzinfo=None),
                    "later": (NOW + timedelta(hours=1)).replace(tzinfo=None),
                    "token": plaintext,
                },
            )
        upgrade(engine)
        with engine.connect() as conn:
            columns = {c["name"] for c in inspect(conn).get_columns("approval_tokens")}
            rows = conn.execute(text("SELECT * FROM approval_tokens")).mappings().all()
        assert "token" not in columns and "token_hash" not in columns and "id" in columns
        assert [(r["id"], r["link"]) for r in rows] == [
            (hashlib.sha256(plaintext.encode()).hexdigest(), None)
        ]
        assert plaintext not in {str(v) for r in rows for v in r.values()}

        store = SqlStore(engine)
        keys = ApiKeys(store)
        keys.create("alice")  # links live while their principal has a key
        tokens = ApprovalTokens(store, keys, LinkKeys((b"k" * 32,), "a test key"))
        with pytest.raises(TokenRefused) as refused:
            tokens.check(plaintext, now=NOW)
        assert refused.value.reason == "unknown"
        fresh = tokens.link("e1", 1, "alice", NOW + timedelta(hours=1), key_id=None, now=NOW)
        assert tokens.check(fresh, "e1", now=NOW).call_seq == 1
        assert tokens.link("e1", 1, "alice", NOW + timedelta(hours=1), key_id=None, now=NOW) == (
            fresh
        )

        # And back: 0006 again (no link handed out, so the next answer mints one), then head.
        downgrade(alembic_config(engine), "0006")
        upgrade(engine)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM approval_tokens")).scalar() == 2
    finally:
        engine.dispose()
