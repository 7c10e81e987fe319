"""The real Lockgate app served on a loopback port, for the approval tests over HTTP
(tests/test_approval_*.py): `serve` and what it yields (`Served`), the code the tests pause
on, readers of the pages and problems it answers, and `execute` through a real MCP client.

Also a pytest plugin: `served`, the app with a small request limit (`BODY_LIMIT`), for the
modules that name it in `pytest_plugins = ["tests.support.approval_app"]` (a module may
define a `served` of its own, which overrides it there). The tests import helpers from here
before pytest registers the plugin, hence PYTEST_DONT_REWRITE: pytest would warn that this
module was imported before it could rewrite its asserts (which carry their own messages).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

import anyio
import httpx2
import pytest
import uvicorn

from lockgate.machine.runtime import Runtime
from lockgate.machine.views import ExecutionView
from lockgate.server.app import create_app
from lockgate.server.keys import ApiKeys
from tests.support.people import Approver
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
    statuses: list[int] = field(default_factory=list)
    people: list[Approver] = field(default_factory=list)

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

    def person(self, name: str = "Ann", principals: tuple[str, ...] = (PRINCIPAL,)) -> Approver:
        """A new approver of `principals`, signed in (the product's `People` opens the
        session; the ceremonies are tested apart), whose browser talks to this server by
        the name its links use."""
        people = self.runtime.people
        issued = people.open_session(people.add(name, principals=list(principals)), "passkey")
        approver = Approver(self.runtime.settings.base_url, issued.token, name)
        self.people.append(approver)
        return approver

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
            served = Served(url, runtime, key, http)
            yield served
            assert 500 not in served.statuses, served.statuses
            for approver in served.people:
                approver.close()
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


def mcp_execute(served: Served, code: str = WRITE_NOTE, key: str | None = None) -> dict[str, Any]:
    """Run `execute` through a real MCP client session, as an agent's client would (with
    `key`, another principal's agent)."""
    return anyio.run(_mcp_execute, served.url, key or served.key, code)
