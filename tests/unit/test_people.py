"""People who approve, in process: approvers and their grants, enrolment links and approver
sessions, each moved only through the write path as the spec declares (`enrolment`,
`approver_session`), on the runtime's clock.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlmodel import select

from lockgate.machine.db.schema import TransitionLog
from lockgate.machine.people import (
    ApproverNotFound,
    ApproverProblem,
    EnrolmentRefused,
    NewPasskey,
    People,
)
from lockgate.machine.sign_in_challenges import SignInsBusy
from lockgate.spec import ApproverSessionStatus as A
from lockgate.spec import EnrolmentStatus as N
from tests.support.engine_records import Clock, MakeRuntime

PASSKEY = NewPasskey(credential_id="cred-1", public_key=b"\x01\x02", sign_count=0, transports=[])


def transitions(people: People, machine: str) -> list[tuple[str, str, str]]:
    with people.store.session() as s:
        rows = s.exec(select(TransitionLog).where(TransitionLog.machine == machine))
        return [(r.event, r.source, r.dest) for r in rows]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def people(make_runtime: MakeRuntime, clock: Clock) -> People:
    return make_runtime(
        clock=clock, enrolment_ttl=timedelta(hours=1), approver_session_ttl=timedelta(hours=2)
    ).people


def test_an_approver_needs_a_name_whose_calls_and_a_way_to_sign_in(people: People) -> None:
    with pytest.raises(ApproverProblem, match="needs a name"):
        people.add(" ", principals=["alice"])
    with pytest.raises(ApproverProblem, match="--principal NAME"):
        people.add("Ann", principals=[])
    with pytest.raises(ApproverProblem, match="not an email address"):
        people.add("Ann", principals=["alice"], email="nope")
    with pytest.raises(ApproverProblem, match="add --issuer"):
        people.add("Ann", principals=["alice"], subject="ann")
    with pytest.raises(ApproverProblem, match="not an OpenID provider's issuer URL"):
        people.add("Ann", principals=["alice"], issuer="passkey", subject="x")
    with pytest.raises(ApproverProblem, match="needs --subject"):
        people.add("Ann", principals=["alice"], issuer="https://id.example")
    people.add("Ann", principals=["alice"], issuer="https://id.example", subject="ann")
    with pytest.raises(ApproverProblem, match="already signs in as ann"):
        people.add("Other Ann", principals=["bob"], issuer="https://id.example", subject="ann")
    with pytest.raises(ApproverNotFound, match="No approver 'nobody'") as missing:
        people.get("nobody")
    assert missing.value.hint == "lockgate approvers list shows them."


def test_grants_say_whose_calls_a_person_decides(people: People) -> None:
    ann = people.add("Ann", principals=["alice", "carol"])
    root = people.add("Root", principals=["*"])
    assert people.may_decide(ann.id, "alice") and people.may_decide(ann.id, "carol")
    assert not people.may_decide(ann.id, "bob")
    assert people.may_decide(root.id, "bob") and people.principals_of(root.id) is None
    assert people.principals_of(ann.id) == ["alice", "carol"]


def test_an_enrolment_link_registers_one_passkey_and_signs_the_person_in(
    people: People, clock: Clock
) -> None:
    bea = people.add("Bea", principals=["bob"])
    link = people.issue_enrolment(bea.id)
    row_id, secret = link.token.split(".")
    # The row keeps a digest, never the secret.
    stored = people.sign_ins.enrolment(row_id)
    assert stored is not None and secret not in stored.secret_hash
    with pytest.raises(EnrolmentRefused) as wrong:
        people.enrolment(f"{row_id}.{'x' * len(secret)}")
    assert wrong.value.reason == "unknown"

    issued = people.complete_enrolment(link.token, PASSKEY)
    person = people.signed_in(issued.token)
    assert person is not None and person.approver.id == bea.id and person.method == "passkey"
    assert person.person.issuer == "passkey"
    with pytest.raises(EnrolmentRefused) as used:
        people.complete_enrolment(link.token, PASSKEY)
    assert used.value.reason == "used"
    assert transitions(people, "enrolment") == [("use", "issued", "used")]
    assert [p.id for p in people.rows.passkeys_of(bea.id)] == ["cred-1"]


def test_a_new_link_revokes_the_old_and_links_expire(people: People, clock: Clock) -> None:
    bea = people.add("Bea", principals=["bob"])
    first = people.issue_enrolment(bea.id)
    second = people.issue_enrolment(bea.id)
    with pytest.raises(EnrolmentRefused) as revoked:
        people.enrolment(first.token)
    assert revoked.value.reason == "revoked"
    people.enrolment(second.token)  # usable
    clock.advance(timedelta(hours=1))
    for _ in range(2):  # found lapsed, then already expired: both say so
        with pytest.raises(EnrolmentRefused) as expired:
            people.enrolment(second.token)
        assert expired.value.reason == "expired"
    # Lapsed links nobody opens are expired by the maintenance round.
    third = people.issue_enrolment(bea.id)
    clock.advance(timedelta(hours=2))
    assert people.expire_due() >= 1
    stored = people.sign_ins.enrolment(third.row_id)
    assert stored is not None and stored.status == N.EXPIRED
    assert ("revoke", "issued", "revoked") in transitions(people, "enrolment")
    assert ("expire", "issued", "expired") in transitions(people, "enrolment")
    oidc = people.add("Oda", principals=["bob"], issuer="https://id.example", email="o@x.io")
    with pytest.raises(ApproverProblem, match="not with a passkey"):
        people.issue_enrolment(oidc.id)


def test_a_session_lives_until_its_expiry_or_a_sign_out(people: People, clock: Clock) -> None:
    ann = people.add("Ann", principals=["alice"])
    first, second = people.open_session(ann, "passkey"), people.open_session(ann, "oidc")
    assert people.signed_in(first.token) is not None
    row_id, secret = first.token.split(".")
    assert people.signed_in(f"{row_id}.{secret[:-1]}x") is None  # a forged secret
    assert people.signed_in("garbage") is None and people.signed_in(None) is None
    assert people.sign_out(second.row_id) and not people.sign_out(second.row_id)
    assert people.signed_in(second.token) is None
    clock.advance(timedelta(hours=2))
    assert people.signed_in(first.token) is None
    stored = people.sign_ins.approver_session(first.row_id)
    assert stored is not None and stored.status == A.EXPIRED
    assert sorted(transitions(people, "approver_session")) == [
        ("expire", "active", "expired"),
        ("sign_out", "active", "signed_out"),
    ]


def test_removing_an_approver_signs_them_out_and_voids_their_links(people: People) -> None:
    bea = people.add("Bea", principals=["bob"])
    session = people.open_session(bea, "passkey")
    link = people.issue_enrolment(bea.id)
    assert people.sign_out_everywhere() == 1
    again = people.open_session(bea, "passkey")
    people.remove(bea.id)
    assert people.signed_in(again.token) is None and people.signed_in(session.token) is None
    with pytest.raises(EnrolmentRefused):
        people.enrolment(link.token)
    assert not people.may_decide(bea.id, "bob")
    assert people.rows.count() == 0
    lonely = people.add("Lonely", principals=["bob"])
    people.remove(lonely.id)  # nothing to end: removed all the same
    assert people.listing() == []


def test_sign_ins_in_progress_are_single_use_and_bounded(
    people: People, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = people.challenges.begin("oidc", {"nonce": "n"}, timedelta(minutes=10))
    assert people.challenges.finish(started, "passkey_sign_in") is None  # another kind: gone
    again = people.challenges.begin("oidc", {"nonce": "n"}, timedelta(minutes=10))
    assert people.challenges.finish(again, "oidc") == {"nonce": "n"}
    assert people.challenges.finish(again, "oidc") is None  # once
    late = people.challenges.begin("oidc", {}, timedelta(minutes=10))
    clock.advance(timedelta(minutes=11))
    assert people.challenges.finish(late, "oidc") is None  # expired
    # Anyone may start one: how many are open at once is bounded.
    monkeypatch.setattr("lockgate.machine.sign_in_challenges.MAX_OPEN_SIGN_INS", 2)
    people.challenges.begin("oidc", {}, timedelta(minutes=10))
    people.challenges.begin("oidc", {}, timedelta(minutes=10))
    with pytest.raises(SignInsBusy, match="2 sign-ins are in progress"):
        people.challenges.begin("oidc", {}, timedelta(minutes=10))
    clock.advance(timedelta(minutes=11))
    people.expire_due()  # the unfinished ones are dropped
    people.challenges.begin("oidc", {}, timedelta(minutes=10))
