"""`execute` with an idempotency key: a re-issued call is attached to the execution the first
one started, over real HTTP with the real `mcp` client, in both protocol eras.

This is what a client does when the answer to an `execute` was lost (a restart, a broken
connection; on the stateless 2026-07-28 protocol there is no session to collect a -32010
on): it sends the same call again, with the same key. The effects are read from the notes
tool's own log, which only a call that really ran writes to.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from alembic.command import downgrade
from sqlalchemy import inspect, text

from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.migrate import alembic_config, upgrade
from lockgate.machine.db.store import SqlStore
from lockgate.machine.execution_errors import IdempotencyKeyReused
from lockgate.machine.execution_reads import AlreadyStarted
from lockgate.machine.faults import Faults, InjectedCrash
from lockgate.spec import CrashPoint
from tests.support.engine_records import MakeRuntime
from tests.support.servers import (
    MODES,
    SharedServer,
    mcp_client,
    run,
    settle,
    structured,
    unique_key,
    write_code,
    writes_of,
)

pytest_plugins = ["tests.support.servers"]


def fresh_key() -> str:
    return uuid.uuid4().hex


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_reissued_execute_is_attached_to_the_execution_it_started(
    shared: SharedServer, mode: str
) -> None:
    """The same call twice with one key: one execution, its one approved write made once,
    and both answers name it."""
    note, key = unique_key(), fresh_key()
    call = {"code": write_code(note), "idempotencyKey": key}

    async def scenario() -> None:
        async with mcp_client(shared.url, shared.alice, mode) as client:
            first = structured(await client.call_tool("execute", call))
            assert first["status"] == "waiting_for_interaction", first
            again = structured(await client.call_tool("execute", call))
            assert again["status"] == "waiting_for_interaction", again
            assert again["executionId"] == first["executionId"]
            accepted = await client.call_tool(
                "resume", {"executionId": first["executionId"], "action": "accept"}
            )
            assert structured(accepted)["status"] in ("completed", "running")
            done = structured(await settle(client, first["executionId"]))
            assert done["status"] == "completed", done
            # After it finished, the retry is answered with the finished execution.
            late = structured(await client.call_tool("execute", call))
            assert late["executionId"] == first["executionId"]
            assert late["status"] == "completed" and late["result"] == done["result"]

    run(scenario())
    assert len(writes_of(shared.deployment, note)) == 1


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_key_used_with_other_code_is_refused_and_starts_nothing(
    shared: SharedServer, mode: str
) -> None:
    note, key = unique_key(), fresh_key()

    async def scenario() -> None:
        async with mcp_client(shared.url, shared.alice, mode) as client:
            first = structured(
                await client.call_tool("execute", {"code": "21 * 2", "idempotencyKey": key})
            )
            assert first["status"] == "completed" and first["result"] == 42
            refused = await client.call_tool(
                "execute", {"code": write_code(note), "idempotencyKey": key}
            )
            body = structured(refused)
            assert refused.is_error, body
            assert body["error"]["code"] == "idempotency_key_reused"
            assert body["executionId"] == first["executionId"]
            # The message alone says which execution holds the key and what to do.
            assert first["executionId"] in body["error"]["message"]
            assert "new idempotencyKey" in body["hint"]

    run(scenario())
    assert writes_of(shared.deployment, note) == []


@pytest.mark.slow
def test_keys_belong_to_their_principal(shared: SharedServer) -> None:
    """Bob sending Alice's key starts Bob's own execution: he is never attached to hers,
    and never told hers exists (not even by a refusal for different code)."""
    key = fresh_key()

    async def scenario() -> None:
        async with mcp_client(shared.url, shared.alice, "legacy") as alice:
            hers = structured(
                await alice.call_tool("execute", {"code": "'alice'", "idempotencyKey": key})
            )
        async with mcp_client(shared.url, shared.bob, "legacy") as bob:
            other_code = structured(
                await bob.call_tool("execute", {"code": "'bob'", "idempotencyKey": key})
            )
            same_code = structured(
                await bob.call_tool("execute", {"code": "'alice'", "idempotencyKey": key})
            )
        assert other_code["status"] == "completed" and other_code["result"] == "bob"
        assert other_code["executionId"] != hers["executionId"]
        # Bob's key now names Bob's execution: the same key with other code is refused for
        # *his* execution, never attached to Alice's.
        assert same_code["error"]["code"] == "idempotency_key_reused"
        assert same_code["executionId"] == other_code["executionId"]

    run(scenario())


@pytest.mark.slow
@pytest.mark.parametrize(
    "key", ["", "k" * 129, 7], ids=["empty", "longer-than-128", "not-a-string"]
)
def test_a_malformed_key_is_invalid_arguments(shared: SharedServer, key: object) -> None:
    async def scenario() -> None:
        async with mcp_client(shared.url, shared.alice, "legacy") as client:
            result = await client.call_tool("execute", {"code": "1", "idempotencyKey": key})
        body = structured(result)
        assert result.is_error and body["error"]["code"] == "invalid_arguments", body
        assert "idempotencyKey" in body["error"]["message"]

    run(scenario())


def test_racing_calls_with_one_key_start_one_execution(make_runtime: MakeRuntime) -> None:
    """Two calls that both find the key free (the check and the insert are not one step):
    the store's unique index refuses the second insert, and `begin` names the first."""
    engine = make_runtime().engine
    store: SqlStore = engine.store
    key = fresh_key()
    both_checked = threading.Barrier(2)
    looked_up = store.executions.by_idempotency_key
    first_lookups: set[int] = set()

    def racing_lookup(principal_id: str, wanted: str) -> object:
        found = looked_up(principal_id, wanted)
        me = threading.get_ident()
        if me not in first_lookups:
            # Each thread's first look happens before either inserts.
            first_lookups.add(me)
            both_checked.wait(timeout=10)
        return found

    store.executions.by_idempotency_key = racing_lookup  # type: ignore[method-assign,assignment]
    outcomes: list[object] = []

    def begin() -> None:
        try:
            outcomes.append(engine.begin("alice", "1 + 1", idempotency_key=key).id)
        except AlreadyStarted as started:
            outcomes.append(started)

    threads = [threading.Thread(target=begin) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    started = [o for o in outcomes if isinstance(o, str)]
    attached = [o for o in outcomes if isinstance(o, AlreadyStarted)]
    assert len(started) == 1 and len(attached) == 1, outcomes
    assert attached[0].execution_id == started[0]


def test_the_same_key_with_other_code_names_the_execution(make_runtime: MakeRuntime) -> None:
    engine = make_runtime().engine
    key = fresh_key()
    first = engine.begin("alice", "1 + 1", idempotency_key=key)
    with pytest.raises(IdempotencyKeyReused) as refused:
        engine.begin("alice", "2 + 2", idempotency_key=key)
    assert refused.value.execution_id == first.id
    with pytest.raises(AlreadyStarted):
        engine.begin("alice", "1 + 1", idempotency_key=key)
    # Another principal's identical call is its own execution.
    assert engine.begin("bob", "1 + 1", idempotency_key=key).id != first.id


@pytest.mark.parametrize("moment", ["before_commit", "after_commit"])
def test_a_retry_after_a_crash_at_the_start_attaches_or_starts_exactly_once(
    make_runtime: MakeRuntime, moment: str
) -> None:
    """The process dies at the execution's start (its insert not yet committed, or just
    committed) and the client re-issues the call on the next process: before the commit
    the key is free and the retry starts the one execution; after it, the retry is
    attached to the execution the crash left."""
    key = fresh_key()
    crash = CrashPoint.parse(f"execution:start:pending->running:{moment}")
    dying = make_runtime(instance_name="dying", faults=Faults([crash]))
    with pytest.raises(InjectedCrash):
        dying.engine.begin("alice", "1 + 1", idempotency_key=key)
    after = make_runtime(instance_name="after")
    left = after.engine.store.executions.by_idempotency_key("alice", key)
    if moment == "before_commit":
        assert left is None
        started = after.engine.begin("alice", "1 + 1", idempotency_key=key)
        assert after.engine.carry_on(started).result == 2
    else:
        assert left is not None
        with pytest.raises(AlreadyStarted) as attached:
            after.engine.begin("alice", "1 + 1", idempotency_key=key)
        assert attached.value.execution_id == left.id


def test_migration_0008_goes_both_ways_under_history(
    make_runtime: MakeRuntime, database_url: str
) -> None:
    """Down to 0007 and up again on a database whose executions have tool calls pointing at
    them (on SQLite a rebuilt `executions` table cannot be dropped under those): the rows
    stay, the key column goes and comes back empty, and keys work again."""
    runtime = make_runtime()
    done = runtime.engine.execute("alice", 'tools.notes.read(key="k")')
    engine = open_engine(database_url)
    try:
        downgrade(alembic_config(engine), "0007")
        with engine.connect() as conn:
            assert "idempotency_key" not in {
                c["name"] for c in inspect(conn).get_columns("executions")
            }
            calls = conn.execute(text("SELECT COUNT(*) FROM tool_calls")).scalar_one()
        assert calls == 1
        upgrade(engine)
    finally:
        engine.dispose()
    after = make_runtime(instance_name="after")
    row = after.engine.store.executions.get(done.id)
    assert row is not None and row.idempotency_key is None
    key = fresh_key()
    first = after.engine.begin("alice", "1", idempotency_key=key)
    with pytest.raises(AlreadyStarted) as attached:
        after.engine.begin("alice", "1", idempotency_key=key)
    assert attached.value.execution_id == first.id
