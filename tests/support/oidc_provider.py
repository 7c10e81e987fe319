"""A real OpenID provider for the approver sign-in tests: npm `oidc-provider` (panva's, pinned in
`tests/support/oidc/package.json`), installed from the registry on first use next to the
virtualenv and run with the wheel's Node by `tests/support/oidc/provider.mjs`, on 127.0.0.1.

`OidcProvider` starts one (its clients and accounts given), and `set_mode` plants a defect in
the ID token of its next token response (the test-only endpoint of provider.mjs). The
person's browser through a sign-in is `tests/support/oidc_browser.py`.

    with OidcProvider(clients=[OidcClient("lockgate", "s3cret", [callback])],
                      accounts=[OidcAccount("alice", "alice@example.test")]) as provider:
        settings = {"issuer": provider.issuer, ...}
        with httpx2.Client() as browser:
            page = sign_in(browser, f"{rp}/signin/oidc?next=/approvals", "alice")
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal, Self, TypedDict, get_args

import httpx2
import pytest

from tests.support.npm import NODE, npm_installed

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tests" / "support" / "oidc" / "package.json"
SCRIPT = ROOT / "tests" / "support" / "oidc" / "provider.mjs"
#: Installed once per checkout, next to the virtualenv (`make clean` removes it).
INSTALL = ROOT / ".venv" / "oidc-provider"
VERSION = "9.13.3"

FaultMode = Literal[
    "normal",
    "wrong_audience",
    "wrong_issuer",
    "expired",
    "unsigned",
    "bad_signature",
    "wrong_nonce",
]
FAULT_MODES: tuple[FaultMode, ...] = get_args(FaultMode)
#: The `iss` of an ID token in mode "wrong_issuer".
WRONG_ISSUER = "https://wrong-issuer.invalid"
#: The `aud` of an ID token in mode "wrong_audience" when the provider has one client only
#: (with several, it is the first other client's id).
OTHER_AUDIENCE = "another-client"

#: A bound on the provider's start (node loading oidc-provider and making an RSA key: well
#: under a second), not a pause.
START_LIMIT_SECS = 30.0


def install_oidc_provider() -> Path:
    """The folder holding `node_modules/oidc-provider` (pinned), installed on first use."""
    npm_installed(PACKAGE, INSTALL, "oidc-provider", VERSION)
    return INSTALL


@pytest.fixture(name="oidc_provider_package", scope="session")
def oidc_provider_package_fixture() -> Path:
    """`install_oidc_provider()` once per session: pass it to `OidcProvider(package=...)`."""
    return install_oidc_provider()


@dataclass(frozen=True)
class OidcClient:
    """A relying party registered with the provider (confidential, authorization code only)."""

    client_id: str
    client_secret: str
    redirect_uris: Sequence[str]
    token_endpoint_auth_method: Literal["client_secret_basic", "client_secret_post"] = (
        "client_secret_basic"
    )
    post_logout_redirect_uris: Sequence[str] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "client_id": self.client_id,
            "client_secret": self.client_secret,
            "redirect_uris": list(self.redirect_uris),
            "token_endpoint_auth_method": self.token_endpoint_auth_method,
            "post_logout_redirect_uris": list(self.post_logout_redirect_uris),
        }


@dataclass(frozen=True)
class OidcAccount:
    """A person the provider knows: signs in with `sub` (any password)."""

    sub: str
    email: str
    email_verified: bool = True
    name: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "sub": self.sub,
            "email": self.email,
            "email_verified": self.email_verified,
            "name": self.name or self.sub,
        }


class FaultState(TypedDict):
    mode: FaultMode
    #: The mode lasts for one token response (then it is "normal" again), else until reset.
    once: bool
    #: Token responses given a defect so far.
    applied: int


@dataclass
class _Started:
    process: subprocess.Popen[str]
    url: str
    port: int
    issuer: str
    kid: str
    readers: list[threading.Thread]
    #: The harness's own calls (test-only endpoint, documents): one client, not one a call.
    http: httpx2.Client


class OidcProvider:
    """`node provider.mjs` on 127.0.0.1: a context manager (or `start()` / `stop()`).

    `issuer` is the Issuer Identifier it claims (default: `url`, where it listens); "{port}"
    and "{url}" in it are replaced by where it listens, so `"http://localhost:{port}"` or
    `"{url}/elsewhere"` give a provider whose discovery document (served at `url`) names
    another issuer. `signing_key` is a private JWK (RSA or EC P-256); absent, the provider
    makes an RSA key at start. `package` is `install_oidc_provider()`'s folder (the
    `oidc_provider_package` fixture); absent, it is installed (or skipped) here."""

    def __init__(
        self,
        *,
        clients: Sequence[OidcClient],
        accounts: Sequence[OidcAccount],
        issuer: str | None = None,
        signing_key: dict[str, Any] | None = None,
        port: int = 0,
        package: Path | None = None,
    ) -> None:
        self._config: dict[str, Any] = {
            "clients": [client.as_json() for client in clients],
            "accounts": [account.as_json() for account in accounts],
        }
        if issuer is not None:
            self._config["issuer"] = issuer
        if signing_key is not None:
            self._config["signing_key"] = signing_key
        self._port = port
        self._package = package
        self._started: _Started | None = None
        #: The provider's stderr (a line per request, its warnings) and stray stdout, last lines.
        self._log: deque[str] = deque(maxlen=500)

    # --- where it is ------------------------------------------------------------------------

    @property
    def _running(self) -> _Started:
        if self._started is None:
            raise RuntimeError("the OpenID provider is not started")
        return self._started

    @property
    def url(self) -> str:
        """Where it listens: `http://127.0.0.1:PORT` (no trailing slash)."""
        return self._running.url

    @property
    def port(self) -> int:
        return self._running.port

    @property
    def issuer(self) -> str:
        """The Issuer Identifier it claims (discovery's `issuer`, ID tokens' `iss`)."""
        return self._running.issuer

    @property
    def kid(self) -> str:
        """The key id of the key signing its ID tokens (the only key in its JWKS)."""
        return self._running.kid

    @property
    def discovery_url(self) -> str:
        """Its discovery document, at `url` (which is the issuer's only when they agree)."""
        return f"{self.url}/.well-known/openid-configuration"

    def log(self) -> str:
        """The last lines it wrote (stderr: a line per request, warnings, server errors)."""
        return "".join(self._log)

    # --- life -------------------------------------------------------------------------------

    def start(self) -> Self:
        if self._started is not None:
            raise RuntimeError("the OpenID provider is already started")
        package = self._package or install_oidc_provider()
        process = subprocess.Popen(
            [str(NODE), str(SCRIPT), "--port", str(self._port), "--modules", str(package)],
            env={**os.environ, "OIDC_PROVIDER_CONFIG": json.dumps(self._config)},
            stdin=subprocess.PIPE,  # closed (by us or by our death), the provider leaves
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )
        lines: queue.Queue[str | None] = queue.Queue()
        assert process.stdout is not None and process.stderr is not None
        readers = [
            _drain(process.stdout, "oidc-provider stdout", lines, self._log),
            _drain(process.stderr, "oidc-provider stderr", None, self._log),
        ]
        try:
            listening = self._wait_listening(process, lines)
        except BaseException:
            _end(process, readers)
            raise
        self._started = _Started(
            process=process,
            url=listening["url"],
            port=int(listening["port"]),
            issuer=listening["issuer"],
            kid=listening["kid"],
            readers=readers,
            http=httpx2.Client(base_url=listening["url"], timeout=10),
        )
        return self

    def _wait_listening(
        self, process: subprocess.Popen[str], lines: queue.Queue[str | None]
    ) -> dict[str, Any]:
        deadline = time.monotonic() + START_LIMIT_SECS
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(
                    f"the OpenID provider did not listen within {START_LIMIT_SECS:.0f} s:\n"
                    + self.log()
                )
            try:
                line = lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:  # stdout closed: it died
                process.wait(5)
                raise RuntimeError(
                    f"the OpenID provider exited ({process.returncode}) before listening:\n"
                    + self.log()
                )
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == "listening":
                return event

    def stop(self) -> None:
        started, self._started = self._started, None
        if started is None:
            return
        started.http.close()
        _end(started.process, started.readers)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- the test-only endpoint and the provider's public documents -------------------------

    def set_mode(self, mode: FaultMode, *, once: bool = True) -> FaultState:
        """The defect `mode` names in the ID token of the next token response (`once`) or of
        every one until `set_mode("normal")`; the fault state as the provider now has it."""
        if mode not in FAULT_MODES:
            raise ValueError(f"mode must be one of {', '.join(FAULT_MODES)}: {mode!r}")
        response = self._running.http.post("/__test/mode", json={"mode": mode, "once": once})
        response.raise_for_status()
        state: FaultState = response.json()
        return state

    def fault_state(self) -> FaultState:
        response = self._running.http.get("/__test/mode")
        response.raise_for_status()
        state: FaultState = response.json()
        return state

    def metadata(self) -> dict[str, Any]:
        """Its discovery document."""
        response = self._running.http.get("/.well-known/openid-configuration")
        response.raise_for_status()
        document: dict[str, Any] = response.json()
        return document

    def jwks(self) -> dict[str, Any]:
        """Its public keys (the JWKS at `jwks_uri`)."""
        response = self._running.http.get("/jwks")
        response.raise_for_status()
        keys: dict[str, Any] = response.json()
        return keys


def _drain(
    stream: IO[str], name: str, lines: queue.Queue[str | None] | None, log: deque[str]
) -> threading.Thread:
    """Read `stream` to its end on a thread (so the process never blocks on a full pipe):
    every line into `log`, and into `lines` too when given (then None at the end)."""

    def run() -> None:
        try:
            for line in stream:
                log.append(line)
                if lines is not None:
                    lines.put(line)
        finally:
            if lines is not None:
                lines.put(None)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def _end(process: subprocess.Popen[str], readers: Sequence[threading.Thread]) -> None:
    """Terminate, then kill if it lingers; its pipes drained to their end and closed."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    for reader in readers:
        reader.join(5)
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):  # a broken pipe to a process that is gone
                stream.close()
