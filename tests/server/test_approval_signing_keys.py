"""The server's signing keys (`server/signing_keys.py`): what seals a client's
`input_required` retry state so that any instance, after any restart, opens it. Approval
links no longer carry anything signed: they name a call (see test_approval_page).

Where the keys come from: LOCKGATE_SIGNING_KEYS, which PostgreSQL requires (several
instances must share the key) and which is never shown; otherwise, on SQLite, a private
file beside the database, made once however many servers start at once and reused after a
restart; on in-memory SQLite a key of the process's own. A key file that cannot be used is
refused in words that say what to do.
"""

from __future__ import annotations

import logging
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from lockgate.machine.runtime import Runtime
from lockgate.machine.settings import Settings
from lockgate.machine.settings_reference import reference_table
from lockgate.server.signing_keys import (
    SigningKeyFileInvalid,
    SigningKeys,
    SigningKeysMissing,
    signing_keys,
)
from tests.support.approval_app import serve
from tests.support.servers import listening, make_deployment, new_database_url

OLD_KEY = "old-approval-link-signing-key-0123456789abcdef"
NEW_KEY = "new-approval-link-signing-key-fedcba9876543210"


def sealed_with(caplog: pytest.LogCaptureFixture) -> str:
    """What the start-up log says the state is sealed with (once per start)."""
    [said] = [r.getMessage() for r in caplog.records if "sealed with" in r.getMessage()]
    return said


# -- configured keys ------------------------------------------------------------------------


def test_configured_keys_are_used_in_order_and_never_shown() -> None:
    settings = Settings(signing_keys=SecretStr(f"{NEW_KEY}, {OLD_KEY}"))
    assert settings.signing_secrets == (NEW_KEY.encode(), OLD_KEY.encode())
    keys = signing_keys(settings)
    assert keys.keys == (NEW_KEY.encode(), OLD_KEY.encode())  # the first seals, both open
    assert "LOCKGATE_SIGNING_KEYS (2 key(s)" in keys.origin
    for shown in (repr(settings), str(settings), repr(keys), keys.origin, reference_table()):
        assert NEW_KEY not in shown and OLD_KEY not in shown
    assert Settings(signing_keys=SecretStr(" ")).signing_keys is None  # set to nothing: unset
    with pytest.raises(ValidationError) as refused:
        Settings(signing_keys=SecretStr(f"{NEW_KEY},too-short-a-secret"))
    assert "key 2 has 18 characters" in str(refused.value)
    assert "too-short-a-secret" not in str(refused.value) and NEW_KEY not in str(refused.value)
    with pytest.raises(ValueError, match="at least one signing key"):
        SigningKeys((), "nothing")


def test_configured_keys_win_over_a_key_file(tmp_path: Path) -> None:
    """With LOCKGATE_SIGNING_KEYS set, a SQLite server makes no key file and reads none."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'x.db'}", signing_keys=SecretStr(NEW_KEY)
    )
    assert signing_keys(settings).keys == (NEW_KEY.encode(),)
    assert list(tmp_path.iterdir()) == []


def test_postgresql_needs_configured_keys() -> None:
    settings = Settings(database_url="postgresql+psycopg://lockgate@db.example/lockgate")
    with pytest.raises(SigningKeysMissing) as refused:
        signing_keys(settings)
    message = str(refused.value)
    assert "LOCKGATE_SIGNING_KEYS is not set" in message
    assert "same secret" in message and "every instance" in message
    configured = Settings(database_url=settings.database_url, signing_keys=SecretStr(NEW_KEY))
    assert signing_keys(configured).keys == (NEW_KEY.encode(),)


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


# -- the SQLite key file --------------------------------------------------------------------


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
    with serve(make_runtime, instance_name="a"):
        pass
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_text()
    assert len(key.strip()) >= 32
    said = sealed_with(caplog)
    assert str(key_file) in said and "created now" in said and key.strip() not in said
    caplog.clear()

    with serve(make_runtime, instance_name="a"):  # the restart: same file, same key
        said = sealed_with(caplog)
        assert str(key_file) in said and "reused" in said
    caplog.clear()
    with serve(make_runtime, instance_name="b"):  # another server on the same database
        assert "reused" in sealed_with(caplog)
    assert key_file.read_text() == key
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert all(key.strip() not in r.getMessage() for r in caplog.records)


def test_servers_starting_at_once_on_one_sqlite_file_make_one_key(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'db' / 'x.db'}")
    (tmp_path / "db").mkdir()
    found: list[SigningKeys] = []
    start = threading.Barrier(8)

    def boot() -> None:
        start.wait()
        found.append(signing_keys(settings))

    threads = [threading.Thread(target=boot) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(found) == 8 and len({keys.keys for keys in found}) == 1
    assert sum("created now" in keys.origin for keys in found) == 1
    assert sorted(p.name for p in (tmp_path / "db").iterdir()) == ["x.db.key"]  # no leftovers
    key_file = tmp_path / "db" / "x.db.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert found[0].keys == (key_file.read_text().strip().encode(),)


def test_a_broken_key_file_is_refused_in_words(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'x.db'}")
    key_file = tmp_path / "x.db.key"
    key_file.write_text("short\n")
    with pytest.raises(SigningKeyFileInvalid) as refused:
        signing_keys(settings)
    assert str(key_file) in str(refused.value) and "Delete it" in str(refused.value)
    assert "short" not in str(refused.value).replace(str(key_file), "")

    key_file.write_bytes(b"\xff\xfe not text at all, but long enough to be a key")
    with pytest.raises(SigningKeyFileInvalid) as refused:
        signing_keys(settings)
    assert str(key_file) in str(refused.value) and "not text" in str(refused.value)
    # Refused, not replaced: the operator decides what becomes of it.
    assert key_file.read_bytes().startswith(b"\xff\xfe")


def test_a_key_file_others_can_read_is_used_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key_file = tmp_path / "x.db.key"
    key_file.write_text("a-key-someone-else-made-0123456789abcdef\n")
    key_file.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="lockgate.server"):
        keys = signing_keys(Settings(database_url=f"sqlite:///{tmp_path / 'x.db'}"))
    assert keys.keys == (b"a-key-someone-else-made-0123456789abcdef",)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert str(key_file) in warning and "chmod 600" in warning
    assert "a-key-someone-else-made" not in warning


def test_in_memory_sqlite_seals_with_a_key_of_its_own() -> None:
    first, second = (signing_keys(Settings(database_url="sqlite://")) for _ in range(2))
    assert first.keys != second.keys and "in-memory" in first.origin
