"""The browser approval surface over real HTTP: the page at /approve/{token} and the API behind
it (GET /api/executions/{id}, POST /api/executions/{id}/resume), on SQLite and PostgreSQL.

The app is the real one (`create_app`), served by uvicorn on a loopback port in a background
thread with its lifespan (boot recovery, drain, close); requests are real HTTP through httpx2.
Approval URLs are obtained the way clients get them: once through the MCP `execute` tool,
otherwise minted for a paused execution exactly as `ApprovalSurface.approval_url` does.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from typing import Any

import anyio
import httpx2
import pytest
import uvicorn

from lockgate.machine.runtime import Runtime
from lockgate.machine.views import ExecutionView
from lockgate.server.app import create_app
from lockgate.server.approval_tokens import ApprovalTokens
from lockgate.server.keys import ApiKeys
from tests.support.canary import CANARY
from tests.support.polling import wait_for as wait_until

PRINCIPAL = "alice"
WRITE_NOTE = 'r = tools.notes.write(key="greeting", text="hello there")\n{"wrote": r}'
TWO_WRITES = (
    'tools.notes.write(key="first", text="one")\n'
    'tools.notes.write(key="second", text="two")\n'
    '"both written"'
)
JSON = {"Content-Type": "application/json"}
#: Words that only a leaked stack trace or framework error page would contain.
TRACE_MARKERS = ("Traceback", 'File "', "Internal Server Error", "sqlalchemy", "Exception")


@dataclass
class Served:
    """A running Lockgate app: its URL, runtime, a principal's API key and an HTTP client."""

    url: str
    runtime: Runtime
    key: str
    http: httpx2.Client
    #: The app's own links (its signing keys): what `mint` hands out is what it would.
    tokens: ApprovalTokens
    statuses: list[int] = field(default_factory=list)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx2.Response:
        response = self.http.request(method, self.url + path, **kwargs)
        self.statuses.append(response.status_code)
        return response

    def get(self, path: str, **kwargs: Any) -> httpx2.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx2.Response:
        return self.request("POST", path, **kwargs)

    def bearer(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}

    def pause(self, code: str = WRITE_NOTE, principal: str = PRINCIPAL) -> ExecutionView:
        view = self.runtime.engine.execute(principal, code)
        assert view.status == "waiting_for_interaction", view
        return view

    def mint(
        self, view: ExecutionView, expires_at: datetime | None = None, *, spare: bool = False
    ) -> str:
        """The link for the call `view` waits on, as `ApprovalSurface.approval_url` hands it
        out; with `expires_at` or `spare`, a token of its own (as older versions minted)."""
        assert view.pending is not None and view.pending.deadline is not None
        tokens = self.tokens
        now = self.runtime.engine.clock()
        if expires_at is None and not spare:
            return tokens.link(
                view.id,
                view.pending.seq,
                view.principal_id,
                view.pending.deadline,
                key_id=None,
                now=now,
            )
        return tokens.mint(
            view.id,
            view.pending.seq,
            view.principal_id,
            expires_at or view.pending.deadline,
            now=now,
        )

    def status_of(self, execution_id: str) -> str:
        return str(self.runtime.engine.view(execution_id).status)


@contextmanager
def serve(make_runtime: Callable[..., Runtime], **overrides: Any) -> Iterator[Served]:
    """Serve `create_app` on a free loopback port; stop it (lifespan shutdown) afterwards."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    runtime = make_runtime(host="127.0.0.1", port=port, **overrides)
    app = create_app(runtime.settings, runtime)
    server = uvicorn.Server(
        uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", workers=1)
    )
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="approval-uvicorn", daemon=True
    )
    url = f"http://127.0.0.1:{port}"
    with httpx2.Client(timeout=30.0) as http:
        thread.start()
        try:

            def ready() -> bool:
                if not thread.is_alive():
                    pytest.fail("the server thread died while starting")
                try:
                    return http.get(url + "/readyz").status_code == 200
                except httpx2.TransportError:
                    return False

            wait_until(ready, "/readyz to answer 200")
            key = ApiKeys(runtime.engine.store).create(PRINCIPAL).secret
            served = Served(url, runtime, key, http, app.state.approval_tokens)
            yield served
            assert 500 not in served.statuses, served.statuses
        finally:
            server.should_exit = True
            thread.join(timeout=30)
            sock.close()
    assert not thread.is_alive(), "the server did not stop"


#: A small request limit, so the oversized-body case sends little.
BODY_LIMIT = 16 * 1024


@pytest.fixture
def served(make_runtime: Callable[..., Runtime]) -> Iterator[Served]:
    with serve(make_runtime, max_request_bytes=BODY_LIMIT) as s:
        yield s


# -- helpers for reading pages ------------------------------------------------------------


class _Texts(HTMLParser):
    """The text of the elements with an id, and every button's label."""

    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[str, str] = {}
        self.buttons: list[str] = []
        self._open: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        ident = dict(attrs).get("id")
        self._open.append((tag, ident))
        if ident:
            self.by_id.setdefault(ident, "")
        if tag == "button":
            self.buttons.append("")

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            if self._open.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        for tag, ident in self._open:
            if ident:
                self.by_id[ident] += data
            if tag == "button":
                self.buttons[-1] += data


def texts(page: str) -> _Texts:
    parser = _Texts()
    parser.feed(page)
    parser.close()
    return parser


def assert_clear_page(response: httpx2.Response, status: int, *words: str) -> str:
    """An HTML page (not JSON, not a trace) with `status` that says `words`."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("text/html")
    page = response.text
    for marker in TRACE_MARKERS:
        assert marker not in page
    found = texts(page).by_id
    notice = found.get("title", "") + " " + found.get("notice", "")
    assert response.headers["x-frame-options"] == "DENY"
    for word in words:
        assert word in notice, notice
    return page


def assert_problem(response: httpx2.Response, status: int, code: str | None = None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and not any(m in error["message"] for m in TRACE_MARKERS)
    if code is not None:
        assert error["code"] == code, error


def token_of(approval_url: str) -> str:
    return approval_url.rsplit("/approve/", 1)[1]


# -- the MCP path: how clients get the URL --------------------------------------------------


async def _mcp_execute(url: str, key: str, code: str) -> dict[str, Any]:
    from mcp.client import Client
    from mcp.client.streamable_http import streamable_http_client

    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30.0) as http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http), mode="legacy") as client,
    ):
        result = await client.call_tool("execute", {"code": code})
    assert not result.is_error, result
    assert result.structured_content is not None
    return dict(result.structured_content)


def mcp_execute(served: Served, code: str = WRITE_NOTE) -> dict[str, Any]:
    """Run `execute` through a real MCP client session, as an agent's client would."""
    return anyio.run(_mcp_execute, served.url, served.key, code)


# -- the page -------------------------------------------------------------------------------


def test_mcp_approval_url_opens_a_page_showing_what_will_run(served: Served) -> None:
    answer = mcp_execute(served)
    assert answer["status"] == "waiting_for_interaction"
    interaction = answer["interaction"]
    url = interaction["approvalUrl"]
    assert url.startswith(f"{served.url}/approve/")
    assert len(token_of(url)) >= 40  # 256 random bits, url-safe

    response = served.get(url.removeprefix(served.url))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    found = texts(response.text)
    assert found.by_id["tool"] == "tools.notes.write"
    assert json.loads(found.by_id["args"]) == {"key": "greeting", "text": "hello there"}
    assert 'tools.notes.write(key="greeting", text="hello there")' in found.by_id["code"]
    assert found.by_id["who"] == PRINCIPAL
    expires = datetime.fromisoformat(answer["expiresAt"])
    assert expires.astimezone(UTC).strftime("%Y-%m-%d %H:%M") in found.by_id["expires"]
    assert f'datetime="{answer["expiresAt"]}"' in response.text
    assert [b.strip() for b in found.buttons] == ["Approve", "Decline"]
    # Not cacheable, not frameable, no Referer carrying the token, scripts by nonce only.
    headers = response.headers
    assert headers["cache-control"] == "no-store"
    assert headers["x-frame-options"] == "DENY"
    assert headers["referrer-policy"] == "no-referrer"
    csp = headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'nonce-" in csp
    assert CANARY not in response.text
    # Opening the page does not use the link up (link previews must not burn it).
    assert served.get(url.removeprefix(served.url)).status_code == 200
    assert served.status_of(answer["executionId"]) == "waiting_for_interaction"


def test_long_code_is_shown_as_an_excerpt(served: Served) -> None:
    filler = "\n".join(f"x{i} = {i}" for i in range(600))
    view = served.pause(filler + "\n" + WRITE_NOTE)
    page = served.get(f"/approve/{served.mint(view)}")
    code = texts(page.text).by_id["code"]
    assert code.startswith("x0 = 0\n") and "more characters)" in code
    assert len(code) < 2200


def test_markup_in_code_and_arguments_is_escaped(served: Served) -> None:
    evil = "</script><script>alert(1)</script><img src=x onerror=alert(2)>"
    code = f"text = {evil!r}\n# {evil}\ntools.notes.write(key={evil!r}, text=text)"
    view = served.pause(code)
    token = served.mint(view)
    page = served.get(f"/approve/{token}").text
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    found = texts(page)
    assert json.loads(found.by_id["args"]) == {"key": evil, "text": evil}
    assert evil in found.by_id["code"]
    # Exactly two script elements: the JSON data block and the page's own (nonced) code.
    assert page.count("<script") == 2
    data = page.split('<script type="application/json" id="data">', 1)[1].split("</script>")[0]
    assert json.loads(data) == {"token": token, "executionId": view.id}


# -- the API --------------------------------------------------------------------------------


def test_get_execution_with_the_token_or_a_bearer_key(served: Served) -> None:
    view = served.pause()
    token = served.mint(view)
    by_token = served.get(f"/api/executions/{view.id}", headers={"X-Approval-Token": token})
    by_key = served.get(f"/api/executions/{view.id}", headers=served.bearer())
    for response in (by_token, by_key):
        assert response.status_code == 200, response.text
        assert response.headers["cache-control"] == "no-store"
        body = response.json()
        assert body["executionId"] == view.id
        assert body["status"] == "waiting_for_interaction"
        assert body["tool"] == "tools.notes.write"
        assert body["argsPreview"] == {"key": "greeting", "text": "hello there"}
        assert body["requestedBy"] == PRINCIPAL
        assert body["code"] == WRITE_NOTE
        assert datetime.fromisoformat(body["expiresAt"]) > datetime.now(UTC)
        assert CANARY not in response.text

    # Nobody else: no credentials, a wrong key, another principal's key, an unknown id.
    missing = served.get(f"/api/executions/{view.id}")
    assert_problem(missing, 401, "unauthorized")
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert_problem(
        served.get(f"/api/executions/{view.id}", headers=served.bearer("lg_not-a-key")), 401
    )
    bob = ApiKeys(served.runtime.engine.store).create("bob").secret
    # Another principal's execution is answered like a missing one (no existence oracle).
    foreign = served.get(f"/api/executions/{view.id}", headers=served.bearer(bob))
    assert_problem(foreign, 404, "not_found")
    unknown = served.get("/api/executions/" + "0" * 32, headers=served.bearer(bob))
    assert foreign.json()["error"]["hint"] == unknown.json()["error"]["hint"]
    assert_problem(served.get("/api/executions/nope", headers=served.bearer()), 404, "not_found")
    assert_problem(
        served.get("/api/executions/nope", headers={"X-Approval-Token": token}),
        403,
        "token_unknown",
    )


def test_accept_completes_the_execution_and_uses_the_token_up(served: Served) -> None:
    answer = mcp_execute(served)
    execution_id, token = answer["executionId"], token_of(answer["interaction"]["approvalUrl"])
    headers = {**JSON, "X-Approval-Token": token, "Origin": served.url}

    response = served.post(
        f"/api/executions/{execution_id}/resume", headers=headers, json={"action": "accept"}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "completed"
    assert body["result"] == {"wrote": {"key": "greeting", "written": True}}
    assert CANARY not in response.text
    view = served.runtime.engine.view(execution_id)
    assert view.status == "completed" and view.result == body["result"]
    assert [c.status for c in view.calls] == ["succeeded"]

    # The link is used up: a second decision, a read and the page all say so, clearly.
    again = served.post(
        f"/api/executions/{execution_id}/resume", headers=headers, json={"action": "accept"}
    )
    assert_problem(again, 410, "token_used")
    assert "already used" in again.json()["error"]["message"]
    assert_problem(
        served.get(f"/api/executions/{execution_id}", headers={"X-Approval-Token": token}),
        410,
        "token_used",
    )
    assert_clear_page(served.get(f"/approve/{token}"), 410, "already used")
    # The principal's key still reads the outcome.
    by_key = served.get(f"/api/executions/{execution_id}", headers=served.bearer())
    assert by_key.json()["status"] == "completed"
    assert by_key.json()["tool"] is None


def test_decline_refuses_the_call(served: Served) -> None:
    view = served.pause(
        'try:\n    tools.notes.write(key="k", text="v")\n    msg = "written"\n'
        "except PermissionError as e:\n    msg = str(e)\nmsg"
    )
    token = served.mint(view)
    response = served.post(
        f"/api/executions/{view.id}/resume",
        headers={**JSON, "X-Approval-Token": token},
        json={"action": "decline"},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "completed"
    assert "declined by the approver" in body["result"]
    after = served.runtime.engine.view(view.id)
    assert [c.status for c in after.calls] == ["declined"]
    notes = served.runtime.sources[0]
    assert notes.effects() == []  # type: ignore[attr-defined]
    assert_clear_page(served.get(f"/approve/{token}"), 410, "already used")


def test_resume_with_a_bearer_key(served: Served) -> None:
    view = served.pause('tools.notes.write(key="k", text="v")\n"done"')
    response = served.post(
        f"/api/executions/{view.id}/resume",
        headers={**JSON, **served.bearer()},
        json={"action": "accept"},
    )
    assert response.status_code == 200 and response.json()["result"] == "done"
    # A link minted before is for a call that is settled now: refused, clearly.
    late = served.mint(view)
    assert_clear_page(served.get(f"/approve/{late}"), 410, "already decided", "completed")
    assert_problem(
        served.post(
            f"/api/executions/{view.id}/resume",
            headers={**JSON, "X-Approval-Token": late},
            json={"action": "accept"},
        ),
        409,
        "already_settled",
    )


def test_a_token_decides_only_the_call_it_was_minted_for(served: Served) -> None:
    view = served.pause(TWO_WRITES)
    first = served.mint(view)
    spare = served.mint(view, spare=True)  # another link for the same first call, unused
    assert (
        served.post(
            f"/api/executions/{view.id}/resume",
            headers={**JSON, "X-Approval-Token": first},
            json={"action": "accept"},
        ).json()["status"]
        == "waiting_for_interaction"
    )
    second = served.runtime.engine.view(view.id)
    assert second.pending is not None and second.pending.seq == 2

    # The spare link was for call 1: it must not approve call 2, which nobody reviewed.
    refused = served.post(
        f"/api/executions/{view.id}/resume",
        headers={**JSON, "X-Approval-Token": spare},
        json={"action": "accept"},
    )
    assert_problem(refused, 409, "already_settled")
    assert served.status_of(view.id) == "waiting_for_interaction"
    assert_clear_page(served.get(f"/approve/{spare}"), 410, "already decided")

    # A link for call 2 shows call 2 and decides it.
    page = texts(served.get(f"/approve/{served.mint(second)}").text)
    assert json.loads(page.by_id["args"]) == {"key": "second", "text": "two"}


def test_expired_token(served: Served) -> None:
    view = served.pause()
    past = datetime.now(UTC) - timedelta(minutes=1)
    token = served.mint(view, expires_at=past)
    assert_clear_page(served.get(f"/approve/{token}"), 410, "expired")
    assert_problem(
        served.post(
            f"/api/executions/{view.id}/resume",
            headers={**JSON, "X-Approval-Token": token},
            json={"action": "accept"},
        ),
        410,
        "token_expired",
    )
    assert_problem(
        served.get(f"/api/executions/{view.id}", headers={"X-Approval-Token": token}),
        410,
        "token_expired",
    )
    assert served.status_of(view.id) == "waiting_for_interaction"


def test_expired_execution_page(make_runtime: Callable[..., Runtime]) -> None:
    with serve(make_runtime, approval_ttl=timedelta(seconds=1)) as served:
        view = served.pause()
        assert view.pending is not None and view.pending.deadline is not None
        deadline = view.pending.deadline
        # A link that outlives its execution's deadline (e.g. minted by an older version).
        token = served.mint(view, expires_at=datetime.now(UTC) + timedelta(hours=1))
        wait_until(lambda: datetime.now(UTC) > deadline, "the deadline")
        assert_clear_page(served.get(f"/approve/{token}"), 410, "expired")
        assert served.status_of(view.id) == "expired"
        assert_problem(
            served.post(
                f"/api/executions/{view.id}/resume",
                headers={**JSON, "X-Approval-Token": token},
                json={"action": "accept"},
            ),
            410,
            "expired",
        )


def test_a_token_of_one_execution_is_refused_on_another(served: Served) -> None:
    a, b = served.pause(), served.pause()
    token_a = served.mint(a)
    headers = {**JSON, "X-Approval-Token": token_a}
    assert_problem(served.get(f"/api/executions/{b.id}", headers=headers), 403, "token_unknown")
    assert_problem(
        served.post(f"/api/executions/{b.id}/resume", headers=headers, json={"action": "accept"}),
        403,
        "token_unknown",
    )
    assert served.status_of(b.id) == "waiting_for_interaction"
    # Refused elsewhere, still good at home.
    ok = served.post(f"/api/executions/{a.id}/resume", headers=headers, json={"action": "accept"})
    assert ok.status_code == 200 and ok.json()["status"] == "completed"


def test_unknown_token_page(served: Served) -> None:
    for token in ("not-a-real-token", "A" * 43, "%3Cscript%3E"):
        page = assert_clear_page(served.get(f"/approve/{token}"), 404, "not valid")
        assert "<script" not in page
    assert served.get("/approve/").status_code == 404


def test_csrf_and_malformed_decisions_are_refused(served: Served) -> None:
    view = served.pause()
    token = served.mint(view)
    path = f"/api/executions/{view.id}/resume"
    with_token = {"X-Approval-Token": token}

    # A cross-site page: its Origin is not ours.
    for origin in ("https://evil.example", "null", f"{served.url}.evil.example"):
        assert_problem(
            served.post(
                path, headers={**JSON, **with_token, "Origin": origin}, json={"action": "accept"}
            ),
            403,
            "forbidden",
        )
    # What an HTML form can send (no preflight): refused before anything is decided.
    for content_type, data in (
        ("application/x-www-form-urlencoded", "action=accept"),
        ("multipart/form-data; boundary=x", "--x--"),
        ("text/plain", '{"action": "accept"}'),
    ):
        assert_problem(
            served.post(path, headers={**with_token, "Content-Type": content_type}, content=data),
            415,
        )
    # No credential at all, or a bad one.
    assert_problem(served.post(path, headers=JSON, json={"action": "accept"}), 401)
    assert_problem(
        served.post(
            path, headers={**JSON, "X-Approval-Token": "forged"}, json={"action": "accept"}
        ),
        403,
    )
    # Malformed bodies.
    for content in ("not json", '{"action": "launch"}', '{"action": "accept", "extra": 1}', "[]"):
        assert_problem(
            served.post(path, headers={**JSON, **with_token}, content=content), 400, "invalid_input"
        )
    big = json.dumps({"action": "accept", "content": "x" * BODY_LIMIT})
    assert_problem(served.post(path, headers={**JSON, **with_token}, content=big), 413)

    def chunked() -> Iterator[bytes]:  # no Content-Length: the limit holds while reading
        yield big.encode()

    assert_problem(served.post(path, headers={**JSON, **with_token}, content=chunked()), 413)

    # None of that decided anything or used the link up: it still works, from our origin.
    assert served.status_of(view.id) == "waiting_for_interaction"
    ok = served.post(
        path,
        headers={
            **with_token,
            "Content-Type": "application/json; charset=utf-8",
            "Origin": served.url,
        },
        json={"action": "accept"},
    )
    assert ok.status_code == 200 and ok.json()["status"] == "completed"


def test_wrong_methods_and_paths_never_fail_with_500(served: Served) -> None:
    view = served.pause()
    assert served.get(f"/api/executions/{view.id}/resume").status_code == 405
    assert served.post(f"/approve/{served.mint(view)}").status_code == 405
    assert served.request("DELETE", f"/api/executions/{view.id}").status_code == 405
    assert served.get("/api/executions/").status_code == 404
