"""Scenarios of people who approve: an enrolment link registering a passkey, a person
signing in and out, deciding a paused call, links and sessions ending, an approver removed.

The operator's terminal and the person's authenticator are the client's: what the operator
was shown (the link) and what the person holds (their session's cookie) are in
`client.memory`, which outlives every crash. The authenticator's proof is taken as given:
the ceremony itself (WebAuthn, OpenID Connect) runs in the server's routes, and is tested
against a real provider and in Chromium; here the lifecycles it drives are crashed.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from lockgate.machine.approval_audit import Decider, Door
from lockgate.machine.engine import Action
from lockgate.machine.execution_errors import (
    ExecutionAlreadySettled,
    ExecutionExpired,
    ExecutionInterrupted,
)
from lockgate.machine.people import ApproverNotFound, EnrolmentRefused, NewPasskey, People
from lockgate.machine.views import ExecutionView
from lockgate.simulation.scenario_steps import started
from lockgate.simulation.world import Client, expect
from lockgate.spec import ExecutionStatus as E

#: The passkey the person's authenticator registers (its proof verified by the routes).
PASSKEY = NewPasskey(credential_id="sim-passkey", public_key=b"sim", sign_count=0, transports=[])
#: One gated write: the execution's own crash points are the other scenarios'.
ONE_WRITE = 'tools.notes.write(key="k", text="v")'
#: The lifecycles these scenarios are about.
PEOPLE_MACHINES = frozenset({"enrolment", "approver_session"})
#: What the scenarios' clocks cross: a session's and a link's lifetime.
PEOPLE_SETTINGS = {
    "approver_session_ttl": timedelta(hours=1),
    "enrolment_ttl": timedelta(hours=2),
}


def _people(client: Client) -> People:
    return client.runtime.people


def _approver(client: Client) -> str:
    """The operator adds Ann, who approves for the client's principal (once)."""
    approver: str = client.remember(
        "ann", lambda: _people(client).add("Ann", principals=[client.principal]).id
    )
    return approver


def _link(client: Client, key: str = "ann.link") -> str:
    """The enrolment link the operator was shown (a crash before that, and it is asked for
    again: the new link revokes the old)."""
    link: str = client.remember(
        key, lambda: _people(client).issue_enrolment(_approver(client)).token
    )
    return link


def _signed_in(client: Client, approver_id: str) -> str:
    """A new session for the person who holds the registered passkey."""
    people = _people(client)
    expect(bool(people.rows.passkeys_of(approver_id)), "signing in with no passkey stored")
    return people.open_session(people.get(approver_id), "passkey").token


def _enrolled(client: Client) -> str:
    """The person registers a passkey with the link and is signed in; if the answer was lost
    after the link was used, the link says so and the person signs in with the passkey."""
    approver_id, link = _approver(client), _link(client)

    def enrol() -> str:
        try:
            return _people(client).complete_enrolment(link, PASSKEY).token
        except EnrolmentRefused as refused:
            expect(refused.reason == "used", f"an unused link was refused: {refused.reason}")
            return _signed_in(client, approver_id)

    session: str = client.remember("ann.session", enrol)
    return session


def _decide(client: Client, key: str, action: Action, session: str) -> ExecutionView | None:
    """The signed-in person decides the call the execution waits on, as the page does."""
    people = _people(client)
    person = people.signed_in(session) or people.signed_in(
        client.remember("ann.again", lambda: _signed_in(client, _approver(client)))
    )
    expect(person is not None, "a person who just signed in is not signed in")
    assert person is not None
    expect(people.may_decide(person.approver.id, client.principal), "Ann may not decide")
    execution_id = client.memory.get(key)
    if execution_id is None:
        return None
    decider = Decider(Door.APPROVAL_PAGE, person.approver.name, person=person.person)
    try:
        return client.runtime.engine.resume(
            execution_id, client.principal, action, decided_by=decider
        )
    except (ExecutionAlreadySettled, ExecutionExpired, ExecutionInterrupted):
        return client.get(execution_id)


def person_enrols_and_decides(client: Client) -> None:
    """The operator adds a person and shows them a link; they register a passkey with it
    and accept a paused write."""
    started(client, "e", ONE_WRITE)
    session = _enrolled(client)
    done = _decide(client, "e.id", Action.ACCEPT, session)
    assert done is not None
    expect(done.status in (E.COMPLETED, E.INTERRUPTED), f"accepted run ended {done.status}")


def person_signs_in_and_out(client: Client) -> None:
    """An enrolled person signs in anew (a second session), and signs out everywhere."""
    approver_id = _approver(client)
    _enrolled(client)
    session: str = client.remember("ann.second", lambda: _signed_in(client, approver_id))
    expect(_people(client).signed_in(session) is not None, "a new session does not work")
    _people(client).sign_out_everywhere(approver_id)
    expect(_people(client).signed_in(session) is None, "a signed-out session still works")


def links_and_sessions_end(client: Client) -> None:
    """A newer link revokes the first; the person registers with it and signs in; a third
    is never opened. Then only the clock moves, past the session's and the third link's
    lifetimes, and the maintenance round ends both."""
    _approver(client)
    first = _link(client, "link.first")
    session = _enrolled(client)  # with a newer link, which revoked the first
    unopened = _link(client, "link.unopened")
    moved: bool = client.remember("moved", lambda: _advance(client, timedelta(hours=3)))
    expect(moved, "the clock did not move")
    client.runtime.maintain()
    people = _people(client)
    for link, why in ((first, "revoked"), (unopened, "expired")):
        try:
            people.enrolment(link)
        except EnrolmentRefused as refused:
            expect(refused.reason == why, f"a link ended {refused.reason}, not {why}")
        else:
            expect(False, f"a link that should be {why} still works")
    expect(people.signed_in(session) is None, "a session past its lifetime still works")


def _advance(client: Client, by: timedelta) -> bool:
    client.world.clock.advance(by)
    return True


def approver_removed(client: Client) -> None:
    """A person with a session and an unused link is removed: signed out and the link void,
    in one transaction."""
    approver_id = _approver(client)
    session = _enrolled(client)
    link = _link(client, "link.unused")
    # Removed before a crash whose answer the operator did not see: nobody to remove.
    with contextlib.suppress(ApproverNotFound):
        _people(client).remove(approver_id)
    people = _people(client)
    expect(people.signed_in(session) is None, "a removed person is still signed in")
    try:
        people.enrolment(link)
    except EnrolmentRefused:
        pass
    else:
        expect(False, "a removed person's link still works")
