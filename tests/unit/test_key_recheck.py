"""An open request's API key is checked again while the request runs (`BearerAuth`): a
revoked key's request is cut off, a request that ended is checked no more, and a store that
fails a check does not end a request whose key was valid."""

from __future__ import annotations

import threading
from typing import Any, cast

import anyio

from lockgate.server.auth import BearerAuth
from lockgate.server.keys import ApiKeys, KeyIdentity

RECHECK = 0.05


class Keys:
    """`ApiKeys.identify`, counted, with a key that can be revoked or a store that fails."""

    def __init__(self) -> None:
        self.checks = 0
        self.revoked = False
        self.failing = 0
        self.hold: Hold | None = None
        self._lock = threading.Lock()

    def identify(self, presented: str) -> KeyIdentity | None:
        with self._lock:
            self.checks += 1
            hold, self.hold = self.hold, None
        if hold is not None:
            hold.wait()
        with self._lock:
            if self.failing:
                self.failing -= 1
                raise RuntimeError("the store is down")
        return None if self.revoked else KeyIdentity("key-1", "principal-1")


class Reply:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def send(self, message: Any) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])


def streaming_for(seconds: float) -> Any:
    """An app that opens a stream and ends it after `seconds`."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"open", "more_body": True})
        await anyio.sleep(seconds)
        await send({"type": "http.response.body", "body": b"done", "more_body": False})

    return app


def request(auth: BearerAuth) -> Reply:
    reply = Reply()
    scope = {"type": "http", "headers": [(b"authorization", b"Bearer lg_test")]}

    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def scenario() -> None:
        with anyio.fail_after(10):
            await auth(scope, receive, reply.send)

    anyio.run(scenario)
    return reply


def test_a_long_request_is_checked_again_and_a_finished_one_no_more() -> None:
    keys = Keys()
    held = Hold()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"open", "more_body": True})
        await anyio.sleep(3 * RECHECK)  # checked again meanwhile
        held.arm(keys)  # the next recheck waits until the request is over
        await anyio.to_thread.run_sync(held.entered.wait, 10)
        await send({"type": "http.response.body", "body": b"done", "more_body": False})

    async def scenario() -> tuple[int, int]:
        auth = BearerAuth(app, cast(ApiKeys, keys), recheck_secs=RECHECK)
        scope = {"type": "http", "headers": [(b"authorization", b"Bearer lg_test")]}
        reply = Reply()

        async def receive() -> Any:
            return {"type": "http.request", "body": b"", "more_body": False}

        await auth(scope, receive, reply.send)
        assert reply.messages[-1]["body"] == b"done"
        over_at = keys.checks
        held.release.set()  # the check under way when the request ended finds the key valid
        await anyio.sleep(6 * RECHECK)  # the loop runs on: a recheck due now would run
        return over_at, keys.checks

    over_at, in_the_end = anyio.run(scenario)
    assert over_at >= 3  # the first check, then again while the stream was open
    assert in_the_end == over_at, "a finished request's key was checked again"


class Hold:
    """Makes the next check wait, in its thread, until released."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def arm(self, keys: Keys) -> None:
        keys.hold = self

    def wait(self) -> None:
        self.entered.set()
        self.release.wait(10)


def test_a_revoked_key_ends_its_open_stream() -> None:
    keys = Keys()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"open", "more_body": True})
        keys.revoked = True
        await anyio.sleep_forever()

    reply = request(BearerAuth(app, cast(ApiKeys, keys), recheck_secs=RECHECK))
    assert reply.status == 200
    assert reply.messages[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


def test_a_store_failing_a_recheck_does_not_end_a_valid_keys_request() -> None:
    keys = Keys()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        keys.failing = 1  # the first recheck fails; the next finds the key valid
        await streaming_for(5 * RECHECK)(scope, receive, send)

    reply = request(BearerAuth(app, cast(ApiKeys, keys), recheck_secs=RECHECK))
    assert reply.messages[-1]["body"] == b"done"
    assert keys.checks >= 3  # the first check, the failed one, and one after it
