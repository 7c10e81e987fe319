"""People in the tests: approvers, signed in, deciding through the page's own API.

`Approver` is a person's browser as a test drives it: an HTTP client holding the session
cookie, which reads a call as the page shows it (with its digest and CSRF token) and sends
the decision the page's script would. Approvers are added, and signed in, through the
product's own `People` (straight to the database, like `create_key_directly`: the sign-in
ceremonies themselves are tested apart, against a real OpenID provider and in Chromium), or
through the real routes with the software passkey (`enrol_with_passkey`, `sign_in_with_passkey`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx2

from lockgate.machine.db.migrate import prepare_database
from lockgate.machine.db.store import SqlStore
from lockgate.machine.people import People
from lockgate.machine.settings import Settings
from lockgate.machine.write_path import WritePath
from lockgate.server.person_session import csrf_token
from lockgate.simulation.passkey_authenticator import SoftAuthenticator

#: An enrolment link as `lockgate approvers add` (or a first start) prints it.
ENROLMENT_LINK = re.compile(r"https?://\S+/enrol/([0-9a-f]{32}\.[A-Za-z0-9_-]+)")


@contextmanager
def people_of(database_url: str, **settings: Any) -> Iterator[People]:
    """The product's `People` on a database (as the CLI opens it)."""
    config = Settings(database_url=database_url, **settings)
    engine = prepare_database(config)
    try:
        store = SqlStore(engine)
        yield People(
            store=store,
            write=WritePath(store),
            settings=config,
            clock=lambda: datetime.now(UTC),
        )
    finally:
        engine.dispose()


def add_approver(people: People, name: str, principals: Sequence[str], **kw: Any) -> str:
    return people.add(name, principals=list(principals), **kw).id


@dataclass
class Approver:
    """A signed-in person's browser: the session cookie, sent to `base_url` only."""

    base_url: str
    cookie: str
    name: str = ""
    http: httpx2.Client = field(default_factory=lambda: httpx2.Client(timeout=30.0))

    @property
    def csrf(self) -> str:
        return csrf_token(self.cookie)

    def close(self) -> None:
        self.http.close()

    def headers(self) -> dict[str, str]:
        """What the page's script sends with a decision: the cookie (the browser adds it),
        the CSRF token and the page's origin."""
        return {**self.cookies(), "X-CSRF-Token": self.csrf, "Origin": _origin(self.base_url)}

    def cookies(self) -> dict[str, str]:
        # Sent by hand: the standard cookie jar does not match a `localhost` domain.
        return {"Cookie": f"lockgate_person={self.cookie}"}

    def get(self, path: str, **kwargs: Any) -> httpx2.Response:
        headers = {**self.cookies(), **kwargs.pop("headers", {})}
        return self.http.get(self.base_url + path, headers=headers, **kwargs)

    def call(self, execution_id: str, call: int) -> httpx2.Response:
        """The call as the page shows it (JSON)."""
        return self.get(f"/api/approvals/{execution_id}/{call}")

    def decide(
        self,
        execution_id: str,
        call: int,
        action: str = "accept",
        *,
        digest: str | None = None,
        grant: Any = None,
        door: str = "page",
    ) -> httpx2.Response:
        """The decision as the page sends it: with the digest of what it showed (read
        first, as the page does, unless given)."""
        if digest is None:
            shown = self.call(execution_id, call)
            assert shown.status_code == 200, shown.text
            digest = shown.json()["digest"]
        body: dict[str, Any] = {"action": action, "digest": digest, "door": door}
        if grant is not None:
            body["grant"] = grant
        return self.http.post(
            f"{self.base_url}/api/approvals/{execution_id}/{call}",
            json=body,
            headers=self.headers(),
        )

    def approve(self, approval_url: str, action: str = "accept") -> httpx2.Response:
        """Decide the call an answer's `approvalUrl` names."""
        execution_id, call = call_of(approval_url)
        return self.decide(execution_id, call, action)

    def inbox(self) -> httpx2.Response:
        return self.get("/api/approvals")


def links_base(base_url: str) -> str:
    """Where a loopback server's links point: its base URL with `localhost` for its host (the
    tests start servers on 127.0.0.1; a passkey needs a host name, so the links say
    `localhost`, and a decision's Origin is checked against that)."""
    return base_url.replace("://127.0.0.1:", "://localhost:")


@contextmanager
def approver_at(
    database_url: str, base_url: str, principals: Sequence[str], name: str = "Ann Approver"
) -> Iterator[Approver]:
    """A new approver of `principals`, signed in, deciding on the server at `base_url`."""
    person = signed_in(database_url, links_base(base_url), name, principals)
    try:
        yield person
    finally:
        person.close()


def call_of(approval_url: str) -> tuple[str, int]:
    """(execution id, call) of an approval URL, `<base>/approve/<execution>/<call>`."""
    execution_id, call = approval_url.rsplit("/approve/", 1)[1].split("/")
    return execution_id, int(call)


def signed_in(
    database_url: str,
    base_url: str,
    name: str,
    principals: Sequence[str],
    **settings: Any,
) -> Approver:
    """A new approver of `principals`, signed in (their session opened by `People`)."""
    with people_of(database_url, **settings) as people:
        approver = people.add(name, principals=list(principals))
        issued = people.open_session(approver, "passkey")
    return Approver(base_url, issued.token, name)


def enrol_with_passkey(
    base_url: str, token: str, device: SoftAuthenticator, http: httpx2.Client | None = None
) -> Approver:
    """Register a passkey with an enrolment link through the real routes, as the enrolment
    page's script does; the person is then signed in."""
    client = http or httpx2.Client(timeout=30.0)
    origin = _origin(base_url)
    headers = {"Origin": origin}
    options = client.post(f"{base_url}/enrol/{token}/options", json={}, headers=headers)
    assert options.status_code == 200, options.text
    body = options.json()
    credential = device.register(body["publicKey"], origin)
    done = client.post(
        f"{base_url}/enrol/{token}",
        json={"challenge": body["challenge"], "credential": credential},
        headers=headers,
    )
    assert done.status_code == 200, done.text
    return Approver(base_url, session_cookie(done), http=client)


def session_cookie(response: httpx2.Response) -> str:
    """The session cookie a response sets (read from Set-Cookie itself: the standard cookie
    jar does not match a `localhost` domain)."""
    for header in response.headers.get_list("set-cookie"):
        name, _, rest = header.partition("=")
        if name.strip() in ("lockgate_person", "__Host-lockgate_person"):
            return rest.split(";", 1)[0]
    raise AssertionError(f"no session cookie set: {response.headers}")


def sign_in_with_passkey(
    base_url: str, device: SoftAuthenticator, http: httpx2.Client | None = None
) -> httpx2.Response:
    """The sign-in page's passkey ceremony through the real routes."""
    if http is None:
        with httpx2.Client(timeout=30.0) as own:
            return sign_in_with_passkey(base_url, device, own)
    origin = _origin(base_url)
    options = http.post(f"{base_url}/signin/passkey/options", json={}, headers={"Origin": origin})
    assert options.status_code == 200, options.text
    body = options.json()
    credential = device.authenticate(body["publicKey"], origin)
    return http.post(
        f"{base_url}/signin/passkey",
        json={"challenge": body["challenge"], "credential": credential},
        headers={"Origin": origin},
    )


def _origin(base_url: str) -> str:
    parts = urlsplit(base_url)
    return f"{parts.scheme}://{parts.netloc}"
