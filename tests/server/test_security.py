"""Security, tried as an attacker would: two principals (alice, bob) on a real server.

Every test talks to a real `lockgate serve` over loopback with raw HTTP, which is what an
attacker has: bob holds a valid key of his own and guesses, replays and probes; nothing he
receives may carry a byte of alice's. Here: replaying streams, approval links (which name a
call and authorise nothing: only a signed-in approver of the call's principal reads or
decides it), DNS rebinding, existence oracles, revoked keys and /metrics. Hostile requests
(huge and fuzzed bodies) and the per-principal limits are in test_security_hostile_requests.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx2
import pytest

from tests.support.people import Approver, approver_at, call_of
from tests.support.security_target import Target, legacy_headers
from tests.support.servers import RawMCP, rpc_body, unique_key, write_code
from tests.support.sse import sse_events

pytest_plugins = ["tests.support.servers", "tests.support.security_target"]
pytestmark = pytest.mark.slow


# -- SSE on the wire -------------------------------------------------------------------------


def read_stream(
    http: httpx2.Client, method: str, url: str, headers: dict[str, str], budget: float = 3.0
) -> tuple[int, str]:
    """Status and everything a response carried within `budget` seconds (an SSE stream
    that stays open is read until then, then dropped)."""
    chunks: list[str] = []
    timeout = httpx2.Timeout(budget, connect=5.0)
    with http.stream(method, url, headers=headers, timeout=timeout) as response:
        deadline = time.monotonic() + budget
        try:
            for chunk in response.iter_text():
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    break
        except httpx2.ReadTimeout:
            pass
        return response.status_code, "".join(chunks)


@dataclass
class AlicePaused:
    """Alice's paused write, as her own stream carried it."""

    session_id: str
    execution_id: str
    #: The call its approval link names.
    call: int
    #: The link's path, `/approve/<execution>/<call>`.
    page: str
    event_ids: list[str]
    secret_bytes: list[str]


@contextmanager
def person(target: Target, name: str, *principals: str) -> Iterator[Approver]:
    """A signed-in approver of `principals`' calls (the module's server is shared: each test
    names its own person)."""
    with approver_at(target.deployment.database_url, target.base_url, principals, name) as made:
        yield made


#: What a page or an answer shows of a call: none of it may reach someone who may not see it.
CALL_CONTENT = ("import tools", "tools.notes", "notes.write", '"arguments"')


def alice_pauses(target: Target, http: httpx2.Client) -> AlicePaused:
    alice = RawMCP(http, target.url, target.alice, "legacy")
    assert alice.initialize().status_code == 200
    assert alice.session_id is not None
    response = http.post(
        target.url,
        headers=alice.headers("tools/call"),
        json={
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "execute", "arguments": {"code": write_code(unique_key())}},
        },
    )
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    ids = [e.id for e in events if e.id]
    assert len(ids) >= 2, response.text  # the priming event and the answer
    answer = rpc_body(response)["result"]["structuredContent"]
    assert answer["status"] == "waiting_for_interaction", answer
    url = answer["interaction"]["approvalUrl"]
    execution_id, call = call_of(url)
    assert execution_id == answer["executionId"], url
    return AlicePaused(
        alice.session_id,
        execution_id,
        call,
        urlsplit(url).path,
        ids,
        [execution_id, alice.session_id],
    )


def waits(target: Target, http: httpx2.Client, execution_id: str, key: str) -> bool:
    """Whether the execution still waits for its decision, as its principal's key reads it."""
    view = http.get(
        f"{target.base_url}/api/executions/{execution_id}",
        headers={"Authorization": f"Bearer {key}"},
    )
    assert view.status_code == 200, view.text
    return bool(view.json()["status"] == "waiting_for_interaction")


def assert_none_of(secrets: list[str], *texts: str) -> None:
    for text in texts:
        for secret in secrets:
            assert secret not in text, f"alice's {secret!r} leaked to bob: {text[:500]!r}"


# -- 1. the replay leak ------------------------------------------------------------------------


def test_bob_replays_nothing_of_alices_streams_however_he_guesses(
    target: Target, http: httpx2.Client
) -> None:
    paused = alice_pauses(target, http)
    bob = RawMCP(http, target.url, target.bob, "legacy")
    assert bob.initialize().status_code == 200
    assert bob.session_id is not None

    # Alice herself can resume her stream from its priming event: replay works, for her.
    status, text = read_stream(
        http,
        "GET",
        target.url,
        legacy_headers(target.alice, paused.session_id, **{"Last-Event-ID": paused.event_ids[0]}),
    )
    assert status == 200 and paused.execution_id in text, (status, text)

    # Every id alice's stream really carried, ids of the old shape (request id and a small
    # counter), and made-up ones: on bob's own session, on alice's session with bob's key,
    # as a POST header and a GET without a session.
    guesses = [*paused.event_ids]
    guesses += [f"{stream}:{n}" for stream in (1, 2, 7, "_GET_stream") for n in range(1, 25)]
    guesses += [e.rpartition(":")[2] for e in paused.event_ids] + ["7", "0", "", "7:"]
    seen: list[str] = []
    for guess in guesses:
        for session in (bob.session_id, paused.session_id, None):
            headers = legacy_headers(target.bob, session, **{"Last-Event-ID": guess})
            status, text = read_stream(http, "GET", target.url, headers, budget=0.5)
            assert_none_of([paused.execution_id], text)
            assert status != 200 or session == bob.session_id, (guess, session, status, text)
            seen.append(text)
        posted = http.post(
            target.url,
            headers=legacy_headers(target.bob, bob.session_id, **{"Last-Event-ID": guess}),
            json={"jsonrpc": "2.0", "id": 7, "method": "ping"},
        )
        seen.append(posted.text)
    # Alice's execution, through every other door bob has.
    for path in (
        f"/api/executions/{paused.execution_id}",
        f"/api/executions/{paused.execution_id}/resume",
    ):
        method = "POST" if path.endswith("resume") else "GET"
        answer = http.request(
            method,
            target.base_url + path,
            headers={"Authorization": f"Bearer {target.bob}", "Content-Type": "application/json"},
            content=b'{"action": "accept"}' if method == "POST" else None,
        )
        assert answer.status_code == 404, answer.text
        seen.append(answer.text)
    resumed = bob.call_tool("resume", {"executionId": paused.execution_id, "action": "accept"})
    seen.append(resumed.text)
    assert_none_of([paused.session_id], *seen)
    # The execution id bob typed himself comes back only in "no such execution".
    for text in seen:
        if paused.execution_id in text:
            assert "No execution" in text, text

    # Alice's call still waits for her approver: nothing bob did decided it.
    assert waits(target, http, paused.execution_id, target.alice)


# -- 6. an approval link reads nothing; a person reads only their principals' calls -----------


def test_a_link_reads_nothing_and_a_person_only_the_calls_they_approve(
    target: Target, http: httpx2.Client
) -> None:
    paused = alice_pauses(target, http)
    call_api = f"/api/approvals/{paused.execution_id}/{paused.call}"
    # The link alone: the page asks for a sign-in, the API refuses it as a credential.
    page = http.get(target.base_url + paused.page)
    assert page.status_code == 303 and page.headers["location"].startswith("/signin?next=")
    for path in (f"/api/executions/{paused.execution_id}", call_api):
        as_link = http.get(
            target.base_url + path, headers={"X-Approval-Token": paused.page.split("/", 2)[2]}
        )
        assert as_link.status_code == 401, as_link.text
        assert as_link.json()["error"]["code"] == "unauthorized"
        for text in (page.text, as_link.text):
            assert not [c for c in CALL_CONTENT if c in text], text
    # Bob's approver, signed in, is not alice's: refused, shown nothing of the call.
    with person(target, "Bob's approver", "bob") as bobs:
        for answer in (bobs.call(paused.execution_id, paused.call), bobs.get(paused.page)):
            assert answer.status_code == 403, answer.text
            assert "does not approve calls of alice" in answer.text
            assert not [c for c in CALL_CONTENT if c in answer.text], answer.text
        refused = bobs.decide(paused.execution_id, paused.call, digest="0" * 64)
        assert refused.status_code == 403, refused.text
    assert waits(target, http, paused.execution_id, target.alice)

    with person(target, "Alice's approver", "alice") as ann:
        shown = ann.call(paused.execution_id, paused.call)
        assert shown.status_code == 200 and shown.json()["waiting"], shown.text
        assert shown.json()["tool"] == "tools.notes.write"
        # Alice decides with her key, through MCP (the target runs in approval mode `model`):
        # the call no longer waits; the person still sees what it was, never its result.
        alice = RawMCP(http, target.url, target.alice, "legacy")
        decided = alice.call_tool(
            "resume", {"executionId": paused.execution_id, "action": "accept"}
        )
        assert rpc_body(decided)["result"]["structuredContent"]["status"] == "completed"
        stale = ann.call(paused.execution_id, paused.call)
        assert stale.status_code == 200 and stale.json()["waiting"] is False, stale.text
        assert "result" not in stale.json() and '"written": true' not in stale.text
        late = ann.decide(paused.execution_id, paused.call, "decline")
        assert late.status_code == 409, late.text
        assert late.json()["error"]["code"] == "already_settled"
    # Alice's key still reads it, as it ended.
    owner = http.get(
        f"{target.base_url}/api/executions/{paused.execution_id}",
        headers={"Authorization": f"Bearer {target.alice}"},
    )
    assert owner.status_code == 200 and owner.json()["status"] == "completed"


# -- 7. DNS rebinding ---------------------------------------------------------------------------


def test_the_approval_page_and_api_answer_only_to_their_own_host(
    target: Target, http: httpx2.Client
) -> None:
    paused = alice_pauses(target, http)
    call_api = f"/api/approvals/{paused.execution_id}/{paused.call}"
    with person(target, "Alice's rebinding approver", "alice") as ann:
        for path, headers in (
            (paused.page, ann.cookies()),
            (call_api, ann.cookies()),
            (f"/api/executions/{paused.execution_id}", {"Authorization": f"Bearer {target.alice}"}),
        ):
            rebound = ann.http.get(ann.base_url + path, headers={**headers, "Host": "evil.example"})
            assert rebound.status_code == 421, rebound.text
            assert paused.execution_id not in rebound.text and "Approve" not in rebound.text
            own = ann.http.get(ann.base_url + path, headers=headers)
            assert own.status_code == 200, own.text
        digest = ann.call(paused.execution_id, paused.call).json()["digest"]
        posted = ann.http.post(
            ann.base_url + call_api,
            headers={**ann.headers(), "Host": "evil.example:80"},
            json={"action": "accept", "digest": digest},
        )
        assert posted.status_code == 421, posted.text
        # Still undecided.
        page = ann.get(paused.page)
        assert page.status_code == 200 and "Approve a call" in page.text
    assert waits(target, http, paused.execution_id, target.alice)


# -- 8. no existence oracles --------------------------------------------------------------------


def test_anothers_execution_and_session_look_exactly_like_missing_ones(
    target: Target, http: httpx2.Client
) -> None:
    paused = alice_pauses(target, http)
    missing_id = "0" * 32
    bob_key = {"Authorization": f"Bearer {target.bob}"}
    foreign = http.get(f"{target.base_url}/api/executions/{paused.execution_id}", headers=bob_key)
    missing = http.get(f"{target.base_url}/api/executions/{missing_id}", headers=bob_key)
    assert foreign.status_code == missing.status_code == 404
    assert foreign.text.replace(paused.execution_id, missing_id) == missing.text

    bob = RawMCP(http, target.url, target.bob, "legacy")
    results = [
        rpc_body(bob.call_tool("resume", {"executionId": eid, "action": "accept"}))["result"]
        for eid in (paused.execution_id, missing_id)
    ]
    texts = [json.dumps(r).replace(paused.execution_id, missing_id) for r in results]
    assert texts[0] == texts[1] and results[0]["isError"]

    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    alices = http.post(target.url, headers=legacy_headers(target.bob, paused.session_id), json=ping)
    nobodys = http.post(target.url, headers=legacy_headers(target.bob, missing_id), json=ping)
    assert alices.status_code == nobodys.status_code == 404
    assert alices.text == nobodys.text


# -- 9. revocation, and /metrics ------------------------------------------------------------------


def test_a_revoked_keys_open_stream_is_closed(target: Target, http: httpx2.Client) -> None:
    carol = target.deployment.create_key("carol")
    raw = RawMCP(http, target.url, carol.secret, "legacy")
    assert raw.initialize().status_code == 200
    opened = threading.Event()
    ended = threading.Event()
    received: list[str] = []

    def listen() -> None:
        headers = legacy_headers(carol.secret, raw.session_id)
        with (
            httpx2.Client(timeout=httpx2.Timeout(60.0)) as own,
            own.stream("GET", target.url, headers=headers) as response,
        ):
            received.append(str(response.status_code))
            opened.set()
            try:
                for chunk in response.iter_text():
                    received.append(chunk)
            except httpx2.TransportError:
                pass
        ended.set()

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert opened.wait(30) and received[0] == "200", received
    assert not ended.is_set()
    target.deployment.revoke_key(carol.id)
    assert ended.wait(30), "the revoked key's stream stayed open"
    # And the key opens nothing new.
    again = http.get(target.url, headers=legacy_headers(carol.secret, raw.session_id))
    assert again.status_code == 401


def test_a_revoked_key_decides_nothing_and_its_call_waits_for_a_person(
    target: Target, http: httpx2.Client
) -> None:
    dave = target.deployment.create_key("dave")
    other_dave_key = target.deployment.create_key("dave")  # dave keeps another, valid key
    raw = RawMCP(http, target.url, dave.secret, "legacy")
    paused = rpc_body(raw.call_tool("execute", {"code": write_code(unique_key())}))
    answer = paused["result"]["structuredContent"]
    execution_id, call = call_of(answer["interaction"]["approvalUrl"])
    target.deployment.revoke_key(dave.id)

    # The revoked key reads and decides nothing; nor does the link, with or without it.
    revoked = {"Authorization": f"Bearer {dave.secret}"}
    link = {"X-Approval-Token": f"{execution_id}/{call}"}
    for method, path, headers in (
        ("GET", f"/api/executions/{execution_id}", revoked),
        ("POST", f"/api/executions/{execution_id}/resume", revoked),
        ("POST", f"/api/executions/{execution_id}/resume", link),
        ("POST", f"/api/executions/{execution_id}/resume", {**link, **revoked}),
    ):
        refused = http.request(
            method,
            target.base_url + path,
            headers={**headers, "Content-Type": "application/json"},
            content=b'{"action": "decline"}',
        )
        assert refused.status_code == 401, refused.text
    # Undecided: dave's remaining key still sees it waiting, and his approver decides it.
    assert waits(target, http, execution_id, other_dave_key.secret)
    with person(target, "Dave's approver", "dave") as dan:
        decided = dan.decide(execution_id, call, "decline")
        assert decided.status_code == 200, decided.text
    view = http.get(
        f"{target.base_url}/api/executions/{execution_id}",
        headers={"Authorization": f"Bearer {other_dave_key.secret}"},
    )
    assert view.json()["status"] == "completed", view.text
    assert "declined" in json.dumps(view.json()["result"]), view.text


def test_metrics_can_require_a_key_and_name_no_one(target: Target, http: httpx2.Client) -> None:
    paused = alice_pauses(target, http)
    anonymous = http.get(f"{target.base_url}/metrics")
    assert anonymous.status_code == 401, anonymous.text
    assert "LOCKGATE_METRICS_REQUIRE_KEY" in anonymous.text
    wrong = http.get(f"{target.base_url}/metrics", headers={"Authorization": "Bearer lg_nope"})
    assert wrong.status_code == 401
    scraped = http.get(
        f"{target.base_url}/metrics", headers={"Authorization": f"Bearer {target.bob}"}
    )
    assert scraped.status_code == 200 and "lockgate_transitions" in scraped.text
    for sensitive in (*paused.secret_bytes, "alice", "bob"):
        assert sensitive not in scraped.text, sensitive
