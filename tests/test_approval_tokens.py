"""Approval links over real HTTP (the real app, uvicorn, SQLite and PostgreSQL).

A paused call has one link: every answer that shows it (the MCP `execute` and `resume`
answers, on any session) gives the same URL, backed by one token row, and the link expires
on the runtime's clock, like the call's deadline. A link is used up in the transaction of
the decision it carries: a crash before that commits leaves the link usable, and of two
uses only one decides. Nothing the database holds opens a link, or moves one to another
call. The keys that sign links (rotation, other instances, where they come from) are in
test_approval_signing_keys.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import httpx2
import pytest
from sqlalchemy import text
from sqlmodel import col, select

from lockgate.machine.db.approval_token_queries import ApprovalTokenUsed, UseApprovalToken
from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.migrate import upgrade
from lockgate.machine.db.schema import ApprovalToken, Execution, TransitionLog
from lockgate.machine.db.store import SqlStore
from lockgate.machine.errors import Conflict
from lockgate.machine.faults import Faults
from lockgate.machine.records import Change
from lockgate.machine.runtime import Runtime
from lockgate.spec.crash_points import CrashPoint
from tests.support.approval_app import (
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
from tests.support.approval_links import (
    NOW,
    decide,
    look_again,
    mcp_calls,
    stored_values,
    tokens_of,
)


@pytest.fixture
def served(make_runtime: Callable[..., Runtime]) -> Iterator[Served]:
    with serve(make_runtime) as s:
        yield s


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
