"""One outbound HTTP call of a tool source, bounded (`HttpLimits`: time, response size,
redirects) and in words when it fails; and how a source's credential rides on it (`Auth`).

Shared by the OpenAPI and GraphQL sources: a failure is a `ToolFailed`, which agent code gets
as a `RuntimeError` naming the call, with the status and an excerpt of the body.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx2
from pydantic import JsonValue

from lockgate.machine.secrets import Redactor
from lockgate.machine.tools.errors import ToolFailed, ToolOutcomeUnknown
from lockgate.machine.tools.outbound import IPNetwork, Reach, guarded_transport

#: Where the operator's own sources may connect: where the operator configured them to.
OPERATORS = Reach()
#: The longest excerpt of an error response's body a failure quotes.
BODY_EXCERPT_CHARS = 500


@dataclass(frozen=True)
class HttpLimits:
    """What one outbound call may take (settings `LOCKGATE_HTTP_*`), and where it may go
    (`reach`: a principal's source reaches public addresses only; `machine/tools/outbound.py`)."""

    #: The whole exchange's bound (connect, headers and body together), not a per-read one.
    timeout_secs: float = 30.0
    max_response_bytes: int = 1024 * 1024
    max_redirects: int = 5
    #: What a failure over `max_response_bytes` names, and what it advises.
    size_setting: str = "LOCKGATE_HTTP_MAX_RESPONSE_BYTES"
    #: The bound on a principal's source's document, and on what a stored source keeps.
    document_bytes: int = 16 * 1024 * 1024
    too_large: str = "ask for less (a filter, a page)."
    reach: Reach = OPERATORS
    #: Where an operator's OpenAPI source keeps what it built from its document
    #: (`LOCKGATE_CATALOGUE_DIR`; `machine/tools/openapi_catalogue.py`); None: nowhere.
    catalogues: Path | None = None

    def for_principal(self, allowed: tuple[IPNetwork, ...]) -> HttpLimits:
        """The same bounds for a principal's source: public addresses (and `allowed`) only,
        and nothing it built kept on the server's disk."""
        return replace(self, reach=Reach(public_only=True, allowed=allowed), catalogues=None)


@dataclass(frozen=True)
class Auth:
    """How a source's calls carry its credential, a secret resolved at dispatch (after any
    approval) from the server's secret store, never written anywhere Lockgate keeps things."""

    secret: str
    kind: str  # bearer | basic | header | query | oauth
    #: The header or query parameter (header and query kinds); the token URL (oauth).
    field: str = ""
    #: The scope asked for (oauth), or "".
    scope: str = ""

    def apply(
        self,
        value: str,
        headers: dict[str, str],
        query: dict[str, Any],
        limits: HttpLimits | None = None,
    ) -> tuple[str, ...]:
        """Put the credential on the request; returns what else must be scrubbed from all
        the call returns (an access token obtained with the secret)."""
        if self.kind == "bearer":
            headers["Authorization"] = f"Bearer {value}"
        elif self.kind == "basic":  # the secret is "user:password"
            headers["Authorization"] = "Basic " + base64.b64encode(value.encode()).decode()
        elif self.kind == "header":
            headers[self.field] = value
        elif self.kind == "query":
            query[self.field] = value
        else:  # oauth: the secret is "client_id:client_secret"
            token = client_credentials_token(self.field, value, self.scope, limits or HttpLimits())
            headers["Authorization"] = f"Bearer {token}"
            return (token,)
        return ()


#: Access tokens by (token URL, sha256 of the client credentials, scope): (expiry, token).
#: In memory only, never stored; bounded, the oldest leaving first.
_TOKENS: OrderedDict[tuple[str, str, str], tuple[float, str]] = OrderedDict()
_TOKENS_LOCK = threading.Lock()
CACHED_TOKENS = 256
#: A token is renewed this long before the expiry its server gave.
TOKEN_MARGIN_SECS = 30.0


def client_credentials_token(
    token_url: str, credentials: str, scope: str, limits: HttpLimits
) -> str:
    """An OAuth 2.0 access token for `credentials` ("client_id:client_secret") by the client
    credentials grant (RFC 6749 4.4), reused until shortly before it expires."""
    digest = hashlib.sha256(credentials.encode()).hexdigest()
    key = (token_url, digest, scope)
    now = time.monotonic()
    with _TOKENS_LOCK:
        cached = _TOKENS.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
    client_id, _, client_secret = credentials.partition(":")
    form = {"grant_type": "client_credentials", **({"scope": scope} if scope else {})}
    what = "getting an OAuth access token"
    basic = base64.b64encode(f"{client_id}:{client_secret}".encode()).decode()
    try:
        answer = fetch(
            "POST", token_url, what, limits, headers={"Authorization": f"Basic {basic}"}, form=form
        )
    except ToolOutcomeUnknown as exc:  # only a token was asked for: the call was not sent
        raise ToolFailed(exc.failure) from None
    try:
        parsed = json.loads(answer.text)
        token = parsed["access_token"]
        lifetime = float(parsed.get("expires_in", 3600))
    except (ValueError, KeyError, TypeError):
        raise ToolFailed(f"{what}: the token endpoint answered no access_token.") from None
    if not isinstance(token, str) or not token:
        raise ToolFailed(f"{what}: the token endpoint answered no access_token.")
    with _TOKENS_LOCK:
        _TOKENS[key] = (now + lifetime - TOKEN_MARGIN_SECS, token)
        while len(_TOKENS) > CACHED_TOKENS:
            _TOKENS.popitem(last=False)
    return token


@dataclass(frozen=True)
class Fetched:
    """A successful answer: its text, its media type, and the URL it came from (after any
    redirect)."""

    text: str
    content_type: str
    url: str


def fetch(
    method: str,
    url: str,
    what: str,
    limits: HttpLimits,
    *,
    query: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    body: JsonValue = None,
    sent: bool = False,
    form: Mapping[str, str] | Sequence[tuple[str, str]] | None = None,
    parts: Sequence[tuple[str, tuple[str | None, bytes, str]]] | None = None,
) -> Fetched:
    """One HTTP exchange within `limits`; `ToolFailed` (naming the call by `what`, e.g.
    `GET /items/7`) for an error status, a timeout, too many redirects, an answer over the
    size limit or a transport failure; `ToolOutcomeUnknown` when the request was sent and
    its answer lost (the connection closed, or the time ran out, before an answer)."""
    limit = limits.max_response_bytes
    # Whether the request began to leave (its headers were being sent): from then on, a
    # connection lost, or an answer that never came, leaves its outcome unknown. Of the
    # last request only: a redirect's next connection starts afresh.
    reached: list[str] = []

    def trace(event: str, _: object) -> None:
        if event.startswith("connection.connect_"):
            reached.clear()
        elif event.endswith(".send_request_headers.started"):
            reached.append(event)

    try:
        try:
            # A client per call: nothing (no connection pool) outlives the call, whichever
            # worker thread makes it; a loopback or keep-alive-less API pays one connect.
            with (
                httpx2.Client(
                    transport=guarded_transport(limits.reach, limits.timeout_secs, url),
                    timeout=limits.timeout_secs,
                    follow_redirects=True,
                    max_redirects=limits.max_redirects,
                ) as client,
                # httpx2 replaces a URL's own query with `params`, even an empty one: merged,
                # a document URL's `?format=json` (or a signed URL's) is kept.
                client.stream(
                    method, url, params=httpx2.URL(url).params.merge(query) if query else None,
                    headers=dict(headers or {}),
                    json=body if sent else None, data=_form_data(form), files=parts or None,
                    extensions={"trace": trace},
                ) as response,
            ):  # fmt: skip
                data = bytearray()
                for chunk in response.iter_bytes():
                    data.extend(chunk)
                    if len(data) > limit:
                        raise ToolFailed(
                            f"{what}: the response is larger than {limit} bytes "
                            f"({limits.size_setting}); {limits.too_large}"
                        )
        except (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError) as exc:
            if reached and not isinstance(exc, httpx2.ConnectError | httpx2.ConnectTimeout):
                lost = _lost(exc, what, url, limits)
                raise ToolOutcomeUnknown(
                    f"{lost} after the request was sent: whether it took effect is unknown.",
                    failure=f"{lost}.",
                ) from None
            raise
    except httpx2.TimeoutException as exc:
        raise ToolFailed(f"{_lost(exc, what, url, limits)}.") from None
    except httpx2.TooManyRedirects:
        raise ToolFailed(
            f"{what}: more than {limits.max_redirects} redirects (LOCKGATE_HTTP_MAX_REDIRECTS)."
        ) from None
    except httpx2.ConnectError as exc:
        # A destination a principal's source may not reach says where and why; any other
        # connection failure only its type.
        said = str(exc) if "may reach only public addresses" in str(exc) else None
        raise ToolFailed(
            f"{what}: refused: {said}."
            if said
            else f"{what}: the request to {url} failed ({type(exc).__name__})."
        ) from None
    except httpx2.HTTPError as exc:
        raise ToolFailed(f"{what}: the request to {url} failed ({type(exc).__name__}).") from None
    text = data.decode(response.encoding or "utf-8", errors="replace")
    if response.status_code >= 400:
        excerpt = text[:BODY_EXCERPT_CHARS] + ("…" if len(text) > BODY_EXCERPT_CHARS else "")
        raise ToolFailed(f"{what} answered HTTP {response.status_code}: {excerpt}")
    return Fetched(text, response.headers.get("content-type", ""), str(response.url))


def _lost(exc: httpx2.HTTPError, what: str, url: str, limits: HttpLimits) -> str:
    """What a call that got no (whole) answer says, before any word on what that means."""
    if isinstance(exc, httpx2.TimeoutException):
        return (
            f"{what}: not answered in full within {limits.timeout_secs:g} s "
            "(LOCKGATE_HTTP_TIMEOUT_SECS, the whole call's bound)"
        )
    return f"{what}: the request to {url} failed ({type(exc).__name__})"


def _form_data(
    form: Mapping[str, str] | Sequence[tuple[str, str]] | None,
) -> dict[str, list[str]] | None:
    """A form's fields for httpx2, which takes a mapping: a repeated key's values in order."""
    if not form:
        return None
    pairs = form.items() if isinstance(form, Mapping) else form
    merged: dict[str, list[str]] = {}
    for key, value in pairs:
        merged.setdefault(key, []).append(value)
    return merged


def send(
    method: str,
    url: str,
    what: str,
    limits: HttpLimits,
    *,
    query: Mapping[str, Any],
    headers: Mapping[str, str],
    body: JsonValue,
    sent: bool,
    auth: Auth | None = None,
    secrets: Mapping[str, str] | None = None,
    form: Sequence[tuple[str, str]] | None = None,
    parts: Sequence[tuple[str, tuple[str | None, bytes, str]]] | None = None,
) -> JsonValue:
    """One tool call over HTTP (`fetch`), with the source's credential on it (`auth`, its
    secret's value in `secrets`); the answer as JSON (or text). A credential derived from
    the secret (an access token) is scrubbed from the answer and from a failure's message
    here, since the engine's own scrubbing knows only the secret itself."""
    query, headers = dict(query), dict(headers)
    derived = auth.apply((secrets or {})[auth.secret], headers, query, limits) if auth else ()
    scrub = Redactor(derived)
    try:
        answer = fetch(
            method, url, what, limits, query=query, headers=headers, body=body, sent=sent,
            form=form, parts=parts,
        )  # fmt: skip
    except ToolOutcomeUnknown as exc:
        failure = scrub.redact_text(exc.failure)
        raise ToolOutcomeUnknown(scrub.redact_text(exc.message), failure=failure) from None
    except ToolFailed as exc:
        raise ToolFailed(scrub.redact_text(exc.message)) from None
    return scrub.redact(_parsed(answer))


def _parsed(answer: Fetched) -> JsonValue:
    if not answer.text:
        return None
    if "json" in answer.content_type:
        try:
            parsed: JsonValue = json.loads(answer.text)
        except ValueError:
            return answer.text
        return parsed
    return answer.text
