"""API keys on the store, in process, on both databases: what the server's authentication
(tests/server/test_server_auth.py, over HTTP) stands on. Only a key's sha256 is stored; a revoked
key identifies nobody and keeps its first revocation time; a principal is stored once
however many keys it gets; the operator's listing is oldest first."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlmodel import Session, select

from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.migrate import upgrade
from lockgate.machine.db.schema import ApiKey, Execution, Principal
from lockgate.machine.db.store import SqlStore
from lockgate.server.keys import KEY_PREFIX, ApiKeys, InvalidPrincipal, KeyNotFound, hash_key


@pytest.fixture
def store(database_url: str) -> Iterator[SqlStore]:
    engine = open_engine(database_url)
    upgrade(engine)
    try:
        yield SqlStore(engine)
    finally:
        engine.dispose()


def test_a_key_identifies_its_principal_until_it_is_revoked(store: SqlStore) -> None:
    keys = ApiKeys(store)
    assert not keys.any_active()
    first = keys.create("alice")
    second = keys.create("alice")
    bobs = keys.create("bob")
    assert first.secret.startswith(KEY_PREFIX) and first.secret != second.secret
    assert keys.authenticate(first.secret) == "alice"
    identity = keys.identify(bobs.secret)
    assert identity is not None and (identity.key_id, identity.principal_id) == (bobs.id, "bob")
    assert keys.any_active() and keys.has_active_key("alice") and keys.is_active(first.id)

    revoked = keys.revoke(first.id)
    assert revoked.revoked_at is not None
    assert keys.authenticate(first.secret) is None
    assert not keys.is_active(first.id)
    assert keys.authenticate(second.secret) == "alice"  # her other key still works
    assert keys.has_active_key("alice")
    keys.revoke(second.id)
    assert not keys.has_active_key("alice")
    assert keys.has_active_key("bob") and keys.any_active()
    keys.revoke(bobs.id)
    assert not keys.any_active()


def test_a_revoked_key_keeps_its_first_revocation_time(store: SqlStore) -> None:
    keys = ApiKeys(store)
    issued = keys.create("alice")
    when = datetime(2026, 1, 1, tzinfo=UTC)
    assert store.keys.revoke(issued.id, when) is not None
    again = store.keys.revoke(issued.id, when + timedelta(days=1))
    assert again is not None and again.revoked_at == when
    assert store.keys.revoke("no-such-key", when) is None


def test_only_the_hash_is_stored_and_a_principal_once(store: SqlStore) -> None:
    keys = ApiKeys(store)
    issued = [keys.create("alice") for _ in range(3)]
    with Session(store.engine) as s:
        rows = list(s.exec(select(ApiKey)))
        principals = list(s.exec(select(Principal)))
    assert {row.key_hash for row in rows} == {hash_key(k.secret) for k in issued}
    assert all(k.secret not in {r.key_hash, r.prefix} for k in issued for r in rows)
    assert [p.id for p in principals] == ["alice"]
    assert [info.id for info in keys.list()] == [k.id for k in issued]  # oldest first


def test_what_does_not_identify_anyone(store: SqlStore) -> None:
    keys = ApiKeys(store)
    issued = keys.create("alice")
    assert keys.identify(issued.secret[len(KEY_PREFIX) :]) is None  # no prefix
    assert keys.identify(KEY_PREFIX + "x" * 43) is None  # unknown
    assert not keys.is_active("no-such-key")
    assert not keys.has_active_key("nobody")
    with pytest.raises(KeyNotFound) as missing:
        keys.revoke("no-such-key")
    assert "keys list" in (missing.value.hint or "")
    for name in ("", "-alice", "a" * 65, "al ice", "alice/bob"):
        with pytest.raises(InvalidPrincipal):
            keys.create(name)
    assert keys.create("a" * 64).principal_id == "a" * 64


def test_live_executions_are_counted_by_status_for_the_metrics(store: SqlStore) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    statuses = ["pending", "running", "running", "waiting_for_interaction"]
    statuses += ["completed", "failed", "cancelled", "expired", "interrupted"]
    with Session(store.engine) as s:
        for n, status in enumerate(statuses):
            s.add(
                Execution(
                    id=f"e{n}",
                    principal_id="alice",
                    status=status,
                    code="1",
                    created_at=now,
                    updated_at=now,
                )
            )
        s.commit()
    counts = {c.status: c.count for c in store.metrics.live_executions_by_status()}
    assert counts == {"pending": 1, "running": 2, "waiting_for_interaction": 1}
