"""One outbound HTTP call of a tool source, bounded (`HttpLimits`: time, response size,
redirects) and in words when it fails; and how a source's credential rides on it (`Auth`).

Shared by the OpenAPI and GraphQL sources: a failure is a `ToolFailed`, which agent code gets
as a `RuntimeError` naming the call, with the status and an excerpt of the body.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx2
from pydantic import JsonValue

from lockgate.machine.tools.errors import ToolFailed

#: The longest excerpt of an error response's body a failure quotes.
BODY_EXCERPT_CHARS = 500


@dataclass(frozen=True)
class HttpLimits:
    """What one outbound call may take (settings `LOCKGATE_HTTP_*`)."""

    timeout_secs: float = 30.0
    max_response_bytes: int = 1024 * 1024
    max_redirects: int = 5
    #: What a failure over `max_response_bytes` names, and what it advises.
    size_setting: str = "LOCKGATE_HTTP_MAX_RESPONSE_BYTES"
    too_large: str = "ask for less (a filter, a page)."


@dataclass(frozen=True)
class Auth:
    """How a source's calls carry its credential, a secret resolved at dispatch (after any
    approval) from the server's secret store, never written anywhere Lockgate keeps things."""

    secret: str
    kind: str  # bearer | basic | header | query
    #: The header or query parameter (header and query kinds).
    field: str = ""

    def apply(self, value: str, headers: dict[str, str], query: dict[str, Any]) -> None:
        if self.kind == "bearer":
            headers["Authorization"] = f"Bearer {value}"
        elif self.kind == "basic":  # the secret is "user:password"
            headers["Authorization"] = "Basic " + base64.b64encode(value.encode()).decode()
        elif self.kind == "header":
            headers[self.field] = value
        else:
            query[self.field] = value


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
) -> Fetched:
    """One HTTP exchange within `limits`; `ToolFailed` (naming the call by `what`, e.g.
    `GET /items/7`) for an error status, a timeout, too many redirects, an answer over the
    size limit or a transport failure."""
    limit = limits.max_response_bytes
    try:
        # A client per call: nothing (no connection pool) outlives the call, whichever
        # worker thread makes it; a loopback or keep-alive-less API pays one connect.
        with (
            httpx2.Client(
                timeout=limits.timeout_secs,
                follow_redirects=True,
                max_redirects=limits.max_redirects,
            ) as client,
            client.stream(
                method, url, params=dict(query or {}), headers=dict(headers or {}),
                json=body if sent else None,
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
    except httpx2.TimeoutException:
        raise ToolFailed(
            f"{what}: no answer within {limits.timeout_secs:g} s (LOCKGATE_HTTP_TIMEOUT_SECS)."
        ) from None
    except httpx2.TooManyRedirects:
        raise ToolFailed(
            f"{what}: more than {limits.max_redirects} redirects (LOCKGATE_HTTP_MAX_REDIRECTS)."
        ) from None
    except httpx2.HTTPError as exc:
        raise ToolFailed(f"{what}: the request to {url} failed ({type(exc).__name__}).") from None
    text = data.decode(response.encoding or "utf-8", errors="replace")
    if response.status_code >= 400:
        excerpt = text[:BODY_EXCERPT_CHARS] + ("…" if len(text) > BODY_EXCERPT_CHARS else "")
        raise ToolFailed(f"{what} answered HTTP {response.status_code}: {excerpt}")
    return Fetched(text, response.headers.get("content-type", ""), str(response.url))


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
) -> JsonValue:
    """One tool call over HTTP (`fetch`); the answer as JSON (or text)."""
    answer = fetch(method, url, what, limits, query=query, headers=headers, body=body, sent=sent)
    if not answer.text:
        return None
    if "json" in answer.content_type:
        try:
            parsed: JsonValue = json.loads(answer.text)
        except ValueError:
            return answer.text
        return parsed
    return answer.text
