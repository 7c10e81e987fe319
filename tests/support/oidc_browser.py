"""The person's browser through a sign-in at the real OpenID provider
(`tests/support/oidc_provider.py`): `sign_in` / `sign_in_to_callback` go from the relying
party's start URL to the provider's login form (filled with the account's `sub`), past
consent (granted at once by the provider) and back to the relying party's callback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx2

#: Hops a sign-in may take (redirects and the login form) before it is called a loop.
MAX_HOPS = 20


class SignInError(Exception):
    """A sign-in that went another way than a browser's through a working provider would
    (an error page, a refused login, a loop); `response` is the last one seen."""

    def __init__(self, message: str, response: httpx2.Response | None = None) -> None:
        super().__init__(message)
        self.response = response


@dataclass
class _Form:
    id: str
    action: str
    method: str
    fields: dict[str, str] = field(default_factory=dict)


class _Page(HTMLParser):
    """The forms of a page (ids, actions, their inputs' names and values) and its error."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[_Form] = []
        self.error: list[str] = []
        self._in_form: _Form | None = None
        self._in_error = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {name: value or "" for name, value in attrs}
        if tag == "form":
            self._in_form = _Form(
                id=attributes.get("id", ""),
                action=attributes.get("action", ""),
                method=attributes.get("method", "get").upper(),
            )
            self.forms.append(self._in_form)
        elif tag == "input" and self._in_form is not None and attributes.get("name"):
            self._in_form.fields[attributes["name"]] = attributes.get("value", "")
        elif tag == "pre" and attributes.get("id") == "error":
            self._in_error = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._in_form = None
        elif tag == "pre":
            self._in_error = False

    def handle_data(self, data: str) -> None:
        if self._in_error:
            self.error.append(data)


def _page(response: httpx2.Response) -> _Page:
    page = _Page()
    if "html" in response.headers.get("content-type", ""):
        page.feed(response.text)
        page.close()
    return page


def _origin(url: str | httpx2.URL) -> tuple[str, str, int | None]:
    parsed = httpx2.URL(str(url))
    return parsed.scheme, parsed.host, parsed.port


def _is_callback(target: str, responder: httpx2.URL) -> bool:
    """A redirect from the provider back to a relying party with its answer: `code` or
    `error` in the query, to another origin than the one redirecting."""
    keys = {key for key, _ in parse_qsl(urlsplit(target).query, keep_blank_values=True)}
    return bool(keys & {"code", "error"}) and _origin(target) != _origin(responder)


def _explain(response: httpx2.Response) -> str:
    page = _page(response)
    detail = "".join(page.error).strip() or response.text[:600]
    return f"{response.request.method} {response.url} -> {response.status_code}: {detail}"


def sign_in_to_callback(
    client: httpx2.Client,
    start_url: str,
    sub: str,
    *,
    password: str = "any password",
    cancel: bool = False,
) -> str:
    """Play the browser from `start_url` (the relying party's URL that redirects to the
    provider, or an authorization request to the provider itself) up to the redirect back to
    the relying party: the callback URL (with `code`, `state`, `iss`), not requested.

    Signs in as `sub` at the login form (`cancel`: presses Cancel there instead, and the
    callback carries `error=access_denied`). Cookies stay in `client`'s jar: the relying
    party's from its start, the provider's session (a later sign-in with the same client
    meets no login form: the provider remembers the person, as it would in a browser)."""
    url, method, data = start_url, "GET", None
    for _ in range(MAX_HOPS):
        response = client.request(method, url, data=data, follow_redirects=False)
        method, data = "GET", None
        if response.is_redirect:
            target = str(response.url.join(response.headers["location"]))
            if _is_callback(target, response.url):
                return target
            url = target
            continue
        if response.status_code >= 400:
            raise SignInError(f"the sign-in failed at {_explain(response)}", response)
        forms = {form.id: form for form in _page(response).forms}
        if "login" not in forms:
            raise SignInError(
                f"neither a redirect nor the login form: {_explain(response)}", response
            )
        form = forms["abort"] if cancel else forms["login"]
        url = str(response.url.join(form.action))
        method = form.method
        data = {**form.fields} if cancel else {**form.fields, "login": sub, "password": password}
    raise SignInError(f"no callback after {MAX_HOPS} hops (a redirect loop?); last: {url}")


def sign_in(
    client: httpx2.Client,
    start_url: str,
    sub: str,
    *,
    password: str = "any password",
    cancel: bool = False,
    follow_redirects: bool = True,
) -> httpx2.Response:
    """`sign_in_to_callback`, then the callback requested as the browser would: the final
    response (the relying party's page after its redirects when `follow_redirects`, its
    callback's own answer otherwise; the callback's is in `history` then). The relying
    party's cookies (its session) are in `client`'s jar afterwards."""
    callback = sign_in_to_callback(client, start_url, sub, password=password, cancel=cancel)
    return client.get(callback, follow_redirects=follow_redirects)


def query_of(url: str) -> dict[str, str]:
    """A URL's query parameters (a callback's `code`, `state`, `iss`, `error`)."""
    return dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))


def with_query(url: str, **params: str | None) -> str:
    """`url` with query parameters replaced (None: removed), e.g. a callback's `state`
    tampered with: `with_query(callback, state="forged")`."""
    parts = urlsplit(url)
    query = {**query_of(url), **params}
    kept = [(key, value) for key, value in query.items() if value is not None]
    return urlunsplit(parts._replace(query=urlencode(kept)))
