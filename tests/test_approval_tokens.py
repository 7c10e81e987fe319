"""Approval links over real HTTP (the real app, uvicorn, SQLite and PostgreSQL).

A paused call has one link: every answer that shows it (the MCP `execute` and `resume`
answers, on any session) gives the same URL, backed by one token row, and the link expires
on the runtime's clock, like the call's deadline. A link is used up in the transaction of
the decision it carries: a crash before that commits leaves the link usable, and of two
uses only one decides.
"""

from __future__ import annotations

import hashlib
import logging
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import httpx2
import pytest
from alembic.command import downgrade
from pydantic import SecretStr, ValidationError
from sqlalchemy import inspect, text
from sqlmodel import col, select

from lockgate.machine.db.approval_token_queries import ApprovalTokenUsed, UseApprovalToken
from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.migrate import alembic_config, upgrade
from lockgate.machine.db.schema import ApprovalToken, Execution, TransitionLog
from lockgate.machine.db.store import SqlStore
from lockgate.machine.errors import Conflict
from lockgate.machine.faults import Faults
from lockgate.machine.records import Change
from lockgate.machine.runtime import Runtime
from lockgate.machine.settings import Settings, reference_table
from lockgate.server.approval_tokens import (
    ApprovalTokens,
    LinkKeys,
    SigningKeyFileInvalid,
    TokenRefused,
    link_keys,
)
from lockgate.server.keys import ApiKeys
from lockgate.spec.crash_points import CrashPoint
from tests.support.servers import listening, make_deployment, new_database_url
from tests.test_approval_page import (
    JSON,
    PRINCIPAL,
    TWO_WRITES,
    WRITE_NOTE,
    Served,
    assert_clear_page,
    assert_problem,
    serve,
    texts,
    token_of,
)


@pytest.fixture
def served(make_runtime: Callable[..., Runtime]) -> Iterator[Served]:
    with serve(make_runtime) as s:
        yield s


async def _mcp_calls(url: str, key: str, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    from mcp.client import Client
    from mcp.client.streamable_http import streamable_http_client

    answers: list[Any] = []
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30.0) as http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http), mode="legacy") as client,
    ):
        for name, arguments in calls:
            result = await client.call_tool(name, arguments)
            assert not result.is_error, result
            assert result.structured_content is not None
            answers.append(dict(result.structured_content))
    return answers


def mcp_calls(served: Served, *calls: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls in one real MCP client session, as an agent's client makes them."""
    return anyio.run(_mcp_calls, served.url, served.key, list(calls))


def look_again(served: Served, execution_id: str) -> dict[str, Any]:
    """`resume` without an action: the client asks how the execution is doing."""
    [answer] = mcp_calls(served, ("resume", {"executionId": execution_id}))
    return answer


def tokens_of(served: Served, execution_id: str) -> list[ApprovalToken]:
    with served.runtime.engine.store.session() as s:
        return list(s.exec(select(ApprovalToken).where(ApprovalToken.execution_id == execution_id)))


def decide(served: Served, execution_id: str, token: str, action: str) -> httpx2.Response:
    return served.post(
        f"/api/executions/{execution_id}/resume",
        headers={**JSON, "X-Approval-Token": token, "Origin": served.url},
        json={"action": action},
    )


# -- one link per paused call ----------------------------------------------------------------


def test_every_answer_showing_a_paused_call_gives_the_same_link(served: Served) -> None:
    [first] = mcp_calls(served, ("execute", {"code": TWO_WRITES}))
    assert first["status"] == "waiting_for_interaction", first
    execution_id = first["executionId"]
    url = first["interaction"]["approvalUrl"]
    # The client asks again, twice (`resume` without an action): the same link.
    [again] = mcp_calls(
        served, ("resume", {"executionId": execution_id}), ("resume", {"executionId": execution_id})
    )[-1:]
    assert again["interaction"]["approvalUrl"] == url
    # Another session of the same client, later: still the same link.
    assert look_again(served, execution_id)["interaction"]["approvalUrl"] == url
    token = token_of(url)
    # The page and the API read it any number of times without minting or using anything.
    for _ in range(2):
        page = served.get(url.removeprefix(served.url))
        assert page.status_code == 200
        assert f'"token": "{token}"' in texts(page.text).by_id["data"]
        read = served.get(f"/api/executions/{execution_id}", headers={"X-Approval-Token": token})
        assert read.status_code == 200, read.text
    [row] = tokens_of(served, execution_id)
    assert row.call_seq == 1 and row.used_at is None

    # Deciding with the link uses it; the next call gets a link of its own, just as stable.
    assert decide(served, execution_id, token, "accept").json()["status"] == (
        "waiting_for_interaction"
    )
    second = look_again(served, execution_id)["interaction"]["approvalUrl"]
    assert second != url
    assert look_again(served, execution_id)["interaction"]["approvalUrl"] == second
    rows = sorted(tokens_of(served, execution_id), key=lambda r: r.call_seq)
    assert [(r.call_seq, r.used_at is not None) for r in rows] == [(1, True), (2, False)]


def test_answers_shown_at_once_still_give_one_link(served: Served) -> None:
    """Several clients asking at the same moment: the link is unique per call, so whoever
    mints second hands out the first one's link."""
    view = served.pause()
    answers: list[str] = []
    start = threading.Barrier(4)

    def ask() -> None:
        start.wait()
        answers.append(look_again(served, view.id)["interaction"]["approvalUrl"])

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 4 and len(set(answers)) == 1
    assert len(tokens_of(served, view.id)) == 1


# -- the runtime's clock ----------------------------------------------------------------------


@dataclass
class Clock:
    """A clock the test moves: the runtime reads every time from it."""

    now: datetime

    def __call__(self) -> datetime:
        return self.now


def test_a_link_expires_on_the_runtime_clock(make_runtime: Callable[..., Runtime]) -> None:
    # A month behind the wall clock: by the wall clock the call's deadline is long past.
    clock = Clock(datetime.now(UTC) - timedelta(days=30))
    with serve(make_runtime, clock=clock, approval_ttl=timedelta(hours=1)) as served:
        [answer] = mcp_calls(served, ("execute", {"code": TWO_WRITES}))
        execution_id, url = answer["executionId"], answer["interaction"]["approvalUrl"]
        deadline = datetime.fromisoformat(answer["expiresAt"])
        assert deadline == clock.now + timedelta(hours=1)
        [row] = tokens_of(served, execution_id)
        assert row.created_at == clock.now and row.expires_at == deadline

        # Just before the deadline on the runtime's clock, the link works.
        clock.now = deadline - timedelta(seconds=1)
        assert served.get(url.removeprefix(served.url)).status_code == 200
        assert look_again(served, execution_id)["interaction"]["approvalUrl"] == url

        # At the deadline it has expired, whatever the wall clock says.
        clock.now = deadline
        assert_clear_page(served.get(url.removeprefix(served.url)), 410, "expired")
        assert_problem(decide(served, execution_id, token_of(url), "accept"), 410)
        # And the call expires on that same clock: link and call end together.
        assert served.runtime.engine.get(execution_id, PRINCIPAL).status == "expired"


# -- a link is used up with its decision, in one transaction ---------------------------------

APPROVED = CrashPoint.parse("tool_call:approve:awaiting_approval->approved:before_commit")


def decisions(served: Served, execution_id: str) -> list[str]:
    """The decisions committed for the execution's calls (approve / decline events)."""
    with served.runtime.engine.store.session() as s:
        return [
            t.event
            for t in s.exec(
                select(TransitionLog)
                .where(
                    col(TransitionLog.record_id).startswith(f"{execution_id}:"),
                    col(TransitionLog.event).in_(["approve", "decline"]),
                )
                .order_by(col(TransitionLog.id))
            )
        ]


def writes_made(served: Served) -> list[str]:
    notes = served.runtime.sources[0]
    return [e["key"] for e in notes.effects() if not e["read"]]  # type: ignore[attr-defined]


def test_a_crash_before_the_decision_commits_leaves_the_link_usable(
    make_runtime: Callable[..., Runtime],
) -> None:
    faults = Faults([APPROVED])
    with serve(make_runtime, faults=faults) as served:
        [answer] = mcp_calls(served, ("execute", {"code": WRITE_NOTE}))
        execution_id, url = answer["executionId"], answer["interaction"]["approvalUrl"]
        token = token_of(url)
        # The person clicks Approve; the process dies just before the decision commits
        # (the answer is whatever a dying server gives: not recorded as the app's).
        served.http.post(
            f"{served.url}/api/executions/{execution_id}/resume",
            headers={**JSON, "X-Approval-Token": token, "Origin": served.url},
            json={"action": "accept"},
        )
        assert faults.fired == [APPROVED]

    with serve(make_runtime) as served:  # the restart
        # Nothing was decided, and the link was not used up with nothing to show for it.
        [row] = tokens_of(served, execution_id)
        assert row.used_at is None
        assert served.status_of(execution_id) == "waiting_for_interaction"
        assert decisions(served, execution_id) == []
        page = f"/approve/{token}"  # the same link, at the restarted server
        assert served.get(page).status_code == 200
        # One click decides, with the same link.
        done = decide(served, execution_id, token, "accept")
        assert done.status_code == 200, done.text
        assert done.json()["status"] == "completed"
        assert decisions(served, execution_id) == ["approve"]
        assert writes_made(served) == ["greeting"]
        assert_problem(decide(served, execution_id, token, "accept"), 410, "token_used")
        assert_clear_page(served.get(page), 410, "already used")


def test_a_link_used_twice_is_refused_with_an_answer_to_act_on(served: Served) -> None:
    [answer] = mcp_calls(served, ("execute", {"code": WRITE_NOTE}))
    execution_id = answer["executionId"]
    token = token_of(answer["interaction"]["approvalUrl"])
    assert decide(served, execution_id, token, "accept").json()["status"] == "completed"
    for action in ("accept", "decline"):
        again = decide(served, execution_id, token, action)
        assert_problem(again, 410, "token_used")
        error = again.json()["error"]
        assert "already used" in error["message"] and error["hint"]
    assert decisions(served, execution_id) == ["approve"]
    assert writes_made(served) == ["greeting"]


def test_two_clicks_with_one_link_decide_once(make_runtime: Callable[..., Runtime]) -> None:
    """Approve in one tab is held just before its decision commits; Decline in another tab
    goes through meanwhile. Only one of them decides; the other is told the link was used."""
    faults = Faults()
    with serve(make_runtime, faults=faults) as served:
        [answer] = mcp_calls(served, ("execute", {"code": WRITE_NOTE}))
        execution_id = answer["executionId"]
        token = token_of(answer["interaction"]["approvalUrl"])
        gate = faults.gate(APPROVED)
        held: list[httpx2.Response] = []

        def approve() -> None:
            with httpx2.Client(timeout=60.0) as other_tab:
                held.append(
                    other_tab.post(
                        f"{served.url}/api/executions/{execution_id}/resume",
                        headers={**JSON, "X-Approval-Token": token},
                        json={"action": "accept"},
                    )
                )

        click = threading.Thread(target=approve)
        click.start()
        try:
            assert gate.wait_until_held()
            declined = decide(served, execution_id, token, "decline")
        finally:
            gate.open()
            click.join()
        [approved] = held
        answers = sorted([approved, declined], key=lambda r: r.status_code)
        assert [r.status_code for r in answers] == [200, 410], [r.text for r in answers]
        assert_problem(answers[1], 410, "token_used")
        assert len(decisions(served, execution_id)) == 1
        view = served.runtime.engine.view(execution_id)
        assert [c.status for c in view.calls] in (["succeeded"], ["declined"])
        assert len(writes_made(served)) == (1 if view.calls[0].status == "succeeded" else 0)
        [row] = tokens_of(served, execution_id)
        assert row.used_at is not None


NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def test_a_token_is_used_in_its_transitions_transaction_or_not_at_all(
    database_url: str,
) -> None:
    engine = open_engine(database_url)
    upgrade(engine)
    store = SqlStore(engine)
    try:
        store.commit(
            [],
            [
                Execution(
                    id="e1",
                    principal_id="alice",
                    status="pending",
                    code="1",
                    created_at=NOW,
                    updated_at=NOW,
                )
            ],
        )
        store.approval_tokens.add(
            ApprovalToken(
                id="h1",
                execution_id="e1",
                call_seq=1,
                principal_id="alice",
                created_at=NOW,
                expires_at=NOW + timedelta(hours=1),
            )
        )
        use = UseApprovalToken("h1", NOW)
        start = Change("execution", "e1", "start", "pending", "running", 0, {})

        # The transition loses its race: the token use goes down with it.
        with pytest.raises(Conflict):
            store.commit(
                [Change("execution", "e1", "start", "pending", "running", 7, {})], (), (), [use]
            )
        row = store.approval_tokens.get("h1")
        assert row is not None and row.used_at is None

        store.commit([start], writes=[use])
        row = store.approval_tokens.get("h1")
        assert row is not None and row.used_at == NOW

        # Used once: a second use is refused, and the transition it came with with it.
        complete = Change("execution", "e1", "complete", "running", "completed", 1, {})
        with pytest.raises(ApprovalTokenUsed) as refused:
            store.commit([complete], writes=[UseApprovalToken("h1", NOW + timedelta(minutes=1))])
        assert refused.value.code == "forbidden" and "already used" in refused.value.message
        with store.session() as s:
            execution = s.get(Execution, "e1")
        assert execution is not None and execution.status == "running"
        row = store.approval_tokens.get("h1")
        assert row is not None and row.used_at == NOW
    finally:
        engine.dispose()


# -- signed links: nothing in the database opens one -----------------------------------------

OLD_KEY = "old-approval-link-signing-key-0123456789abcdef"
NEW_KEY = "new-approval-link-signing-key-fedcba9876543210"


def stored_values(served: Served) -> list[str]:
    """Every value of every column of the links table, as a reader of the database (a
    leaked backup, a replica's user) sees them."""
    with served.runtime.engine.store.engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM approval_tokens")).mappings().all()
    found: list[str] = []
    for row in rows:
        for value in row.values():
            if value is None:
                continue
            found.append(str(value))
            if isinstance(value, datetime):
                found.append(value.isoformat())
    return list(dict.fromkeys(found))


def test_the_database_holds_nothing_that_opens_a_link(served: Served) -> None:
    [answer] = mcp_calls(served, ("execute", {"code": WRITE_NOTE}))
    execution_id, url = answer["executionId"], answer["interaction"]["approvalUrl"]
    token = token_of(url)
    [row] = tokens_of(served, execution_id)
    values = stored_values(served)
    assert row.id in values and execution_id in values  # the dump is of the real row
    # Each value as a link, and as the secret part of a link to the row.
    tried = values + [f"{row.id}-{value}" for value in values]
    assert token not in tried
    for value in tried:
        page = served.get(f"/approve/{quote(value, safe='')}")
        assert_clear_page(page, 404, "not valid")
        read = served.get(f"/api/executions/{execution_id}", headers={"X-Approval-Token": value})
        assert_problem(read, 403, "token_unknown")
        refused = decide(served, execution_id, value, "accept")
        assert_problem(refused, 403, "token_unknown")
    assert served.status_of(execution_id) == "waiting_for_interaction"
    assert decisions(served, execution_id) == []
    # The real link works, and decides.
    assert served.get(f"/approve/{token}").status_code == 200
    done = decide(served, execution_id, token, "accept")
    assert done.status_code == 200 and done.json()["status"] == "completed", done.text
    assert writes_made(served) == ["greeting"]


def test_a_row_pointed_at_another_call_no_longer_opens(served: Served) -> None:
    """Someone who can write the database but has no key cannot move a link to a call it
    was not minted for: the mac covers the binding."""
    a, b = served.pause(), served.pause()
    token = token_of(look_again(served, a.id)["interaction"]["approvalUrl"])
    [row] = tokens_of(served, a.id)
    with served.runtime.engine.store.engine.begin() as conn:
        conn.execute(
            text("UPDATE approval_tokens SET execution_id = :b WHERE id = :id"),
            {"b": b.id, "id": row.id},
        )
    assert_clear_page(served.get(f"/approve/{token}"), 404, "not valid")
    assert_problem(decide(served, b.id, token, "accept"), 403, "token_unknown")
    assert served.status_of(b.id) == "waiting_for_interaction"


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
        store = SqlStore(engine)
        store.commit(
            [],
            [
                Execution(
                    id="e1",
                    principal_id="alice",
                    status="pending",
                    code="1",
                    created_at=NOW,
                    updated_at=NOW,
                )
            ],
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
