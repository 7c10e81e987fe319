"""A real webhook endpoint on loopback, as an operator's relay would run one: it verifies every
POST with the Standard Webhooks library (the receiver's side of the scheme) and keeps what
it accepted, per `webhook-id`. A test scripts its answers (`answers`: statuses to give
before it accepts) and waits for deliveries on a condition, never on a sleep."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from lockgate.machine.webhook_signing import make_secret
from tests.support.asgi_thread import serve_in_thread


@dataclass
class Receiver:
    secret: str = field(default_factory=make_secret)
    #: webhook-id -> every verified body received for it.
    received: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: Attempts refused for their signature.
    forged: int = 0
    #: Every attempt, in order: (webhook-id, the status answered).
    attempts: list[tuple[str, int]] = field(default_factory=list)
    #: Statuses to answer before accepting (popped one per attempt); 302 redirects.
    answers: list[int] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    async def hook(self, request: Request) -> Response:
        body = await request.body()
        event_id = request.headers.get("webhook-id", "?")
        try:
            event = Webhook(self.secret).verify(body, dict(request.headers))
        except WebhookVerificationError:
            return self._answer(event_id, 401, forged=True)
        if self.answers:
            status = self.answers.pop(0)
            if status == 302:
                self._answer(event_id, status)
                return Response(status_code=302, headers={"location": "/elsewhere"})
            return self._answer(event_id, status)
        with self.changed:
            self.received.setdefault(event_id, []).append(event)
        return self._answer(event_id, 200)

    def _answer(self, event_id: str, status: int, *, forged: bool = False) -> Response:
        with self.changed:
            self.attempts.append((event_id, status))
            self.forged += forged
            self.changed.notify_all()
        return PlainTextResponse("refused" if status >= 300 else "ok", status_code=status)

    def wait_for(self, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Every accepted event (one per id), once at least `count` ids were accepted."""
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.received) >= count, timeout):
                raise AssertionError(f"{len(self.received)} events arrived, not {count}")
            return [bodies[0] for bodies in self.received.values()]


@dataclass
class RunningReceiver:
    receiver: Receiver
    url: str


def serve_receiver(receiver: Receiver) -> Iterator[RunningReceiver]:
    """Serve `receiver` at http://127.0.0.1:<free port>/hooks until the generator closes."""
    app = Starlette(routes=[Route("/hooks", receiver.hook, methods=["POST"])])
    for port in serve_in_thread(app, "webhook-receiver"):
        yield RunningReceiver(receiver, f"http://127.0.0.1:{port}/hooks")
