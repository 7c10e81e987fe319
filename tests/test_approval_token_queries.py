"""Approval links on the store, in process, on both databases: what the approval page and
API (tests/test_approval_tokens.py, over HTTP) stand on. A call's link is handed out under
one name (`<execution>:<call>:<key>`); handing a fresh row out retires the old one from that
name in the same transaction; of two writers handing out rows at once, both get the one
that won; a link decides once; expired links are purged, and only those."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update
from sqlmodel import Session, col, select

from lockgate.machine.db.approval_token_queries import ApprovalTokenUsed, UseApprovalToken
from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.migrate import upgrade
from lockgate.machine.db.schema import ApprovalToken, Execution
from lockgate.machine.db.store import SqlStore

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
LINK = "e1:1:key1"


@pytest.fixture
def store(database_url: str) -> Iterator[SqlStore]:
    engine = open_engine(database_url)
    upgrade(engine)
    try:
        with Session(engine) as s:
            s.add(
                Execution(
                    id="e1",
                    principal_id="alice",
                    status="waiting_for_interaction",
                    code="1",
                    created_at=NOW,
                    updated_at=NOW,
                )
            )
            s.commit()
        yield SqlStore(engine)
    finally:
        engine.dispose()


def token(
    row_id: str, *, link: str | None = LINK, expires: datetime | None = None
) -> ApprovalToken:
    return ApprovalToken(
        id=row_id,
        execution_id="e1",
        call_seq=1,
        principal_id="alice",
        key_id="key1",
        created_at=NOW,
        expires_at=expires or NOW + timedelta(hours=1),
        link=link,
    )


def links(store: SqlStore) -> dict[str, str | None]:
    with Session(store.engine) as s:
        return {row.id: row.link for row in s.exec(select(ApprovalToken))}


def test_a_fresh_row_handed_out_retires_the_old_one_from_its_name(store: SqlStore) -> None:
    first = store.approval_tokens.hand_out(token("t1"))
    assert first.id == "t1"
    by_name = store.approval_tokens.by_link(LINK)
    assert by_name is not None and by_name.id == "t1"

    second = store.approval_tokens.hand_out(token("t2"), retire="t1")
    assert second.id == "t2"
    by_name = store.approval_tokens.by_link(LINK)
    assert by_name is not None and by_name.id == "t2"
    # The retired row stays (its URL is refused as no longer handed out, not as unknown).
    assert links(store) == {"t1": None, "t2": LINK}


def test_retiring_leaves_a_row_handed_out_under_another_name_alone(store: SqlStore) -> None:
    """`retire` names a row by id, and clears it only from the name being handed out: a row
    that is another call's (or key's) link keeps it."""
    store.approval_tokens.hand_out(token("other", link="e1:1:key2"))
    store.approval_tokens.hand_out(token("t1"), retire="other")
    assert links(store) == {"other": "e1:1:key2", "t1": LINK}


def test_two_writers_handing_out_one_name_both_get_the_winner(store: SqlStore) -> None:
    """Two answers shown at once, each with a row of its own: the unique name refuses the
    second insert, and its writer is given the first's row, so both show one link."""
    store.approval_tokens.hand_out(token("won"))
    got = store.approval_tokens.hand_out(token("lost"))
    assert got.id == "won"
    assert links(store) == {"won": LINK}


def test_a_winner_retired_before_the_loser_reads_it_lets_the_loser_try_again(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loser of the race looks the winner up, but a third writer retired it in between
    (staged here with a real write at that moment): the name is free again, and the
    loser's row is handed out on its next try."""
    store.approval_tokens.hand_out(token("won"))
    looked_up = store.approval_tokens.by_link
    retired_first: list[str] = []

    def retired_then_looked_up(link: str) -> ApprovalToken | None:
        if not retired_first:
            retired_first.append(link)
            with Session(store.engine) as s:
                s.execute(
                    update(ApprovalToken).where(col(ApprovalToken.id) == "won").values(link=None)
                )
                s.commit()
        return looked_up(link)

    monkeypatch.setattr(store.approval_tokens, "by_link", retired_then_looked_up)
    got = store.approval_tokens.hand_out(token("late"))
    assert retired_first == [LINK]
    assert got.id == "late"
    assert links(store) == {"won": None, "late": LINK}


def test_a_name_that_never_settles_is_an_error_after_three_tries(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each lookup after a lost race finds the name retired again: the writer gives up
    after three tries with an error rather than spinning."""
    store.approval_tokens.hand_out(token("won"))
    lookups: list[str] = []

    def always_retired(link: str) -> ApprovalToken | None:
        lookups.append(link)
        return None

    monkeypatch.setattr(store.approval_tokens, "by_link", always_retired)
    with pytest.raises(RuntimeError, match="kept changing while being handed out"):
        store.approval_tokens.hand_out(token("late"))
    assert lookups == [LINK] * 3
    assert links(store) == {"won": LINK}


def test_a_link_decides_once(store: SqlStore) -> None:
    store.approval_tokens.hand_out(token("t1"))
    with store.engine.begin() as conn:
        UseApprovalToken("t1", NOW).write(conn)
    used = store.approval_tokens.get("t1")
    assert used is not None and used.used_at is not None
    with store.engine.begin() as conn, pytest.raises(ApprovalTokenUsed) as refused:
        UseApprovalToken("t1", NOW + timedelta(seconds=1)).write(conn)
    assert refused.value.as_dict() == {
        "code": "forbidden",
        "message": "This approval link was already used: a decision was already sent with "
        "it, and each link decides once.",
        "hint": "Fetch the execution (with an API key) to see the decision and its outcome.",
    }
    # The first use's time stands.
    again = store.approval_tokens.get("t1")
    assert again is not None and again.used_at == used.used_at


def test_purge_deletes_only_links_expired_before_the_bound(store: SqlStore) -> None:
    bound = NOW + timedelta(days=1)
    store.approval_tokens.add(token("long_gone", link=None, expires=bound - timedelta(days=3)))
    store.approval_tokens.add(token("just_gone", link=None, expires=bound - timedelta(seconds=1)))
    store.approval_tokens.add(token("at_bound", link=None, expires=bound))
    store.approval_tokens.add(token("live", link=None, expires=bound + timedelta(hours=1)))
    assert store.approval_tokens.purge(bound) == 2
    assert sorted(links(store)) == ["at_bound", "live"]
    assert store.approval_tokens.purge(bound) == 0


def test_retiring_a_row_that_no_longer_holds_the_name_leaves_the_holder_alone(
    store: SqlStore,
) -> None:
    """Two answers both saw `t1` as the link and each retires it for a fresh row: the first
    hands out `t2`; the second's retire names `t1`, which no longer holds the name, so `t2`
    keeps it and the second answer is given `t2` (one link, however the answers interleave)."""
    store.approval_tokens.hand_out(token("t1"))
    store.approval_tokens.hand_out(token("t2"), retire="t1")
    got = store.approval_tokens.hand_out(token("t3"), retire="t1")
    assert got.id == "t2"
    assert links(store) == {"t1": None, "t2": LINK}
