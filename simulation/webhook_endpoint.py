"""The operator's webhook endpoint, as the simulated world has it: what it received, checked.

The endpoint is a boundary Lockgate does not own, so the world stands in for it (the real
HTTP POST is tested against a real server on loopback in `tests/server/test_webhooks.py`). It
verifies every attempt with the Standard Webhooks library a receiver would use, keeps what
it accepted (its memory outlives every crash, as a real endpoint's would) and can be told to
refuse attempts, to drive retries and abandonment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from lockgate.machine.webhook_signing import make_secret
from lockgate.machine.webhooks import Attempt, DeliveryFailed

#: The secret every simulated world's server signs with.
SIM_SECRET = make_secret()
#: Settings a scenario adds to send its approval events to the endpoint.
WEBHOOK_SETTINGS: dict[str, Any] = {
    "webhook_url": "http://hooks.sim.invalid/lockgate",
    "webhook_secret": SIM_SECRET,
}


@dataclass
class WebhookEndpoint:
    #: Event id -> every body accepted for it (a redelivery after a crash adds another).
    received: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: Attempts whose signature did not verify (must stay empty).
    forged: list[str] = field(default_factory=list)
    #: While True, every attempt is refused with a 503.
    down: bool = False

    def receive(self, attempt: Attempt) -> None:
        """What the endpoint does with one POST (the outbox's `Poster`)."""
        try:
            body = Webhook(SIM_SECRET).verify(attempt.body, attempt.headers)
        except WebhookVerificationError:
            self.forged.append(attempt.headers.get("webhook-id", "?"))
            raise DeliveryFailed("HTTP 401: bad signature") from None
        if self.down:
            raise DeliveryFailed("HTTP 503: the endpoint is down")
        assert isinstance(body, dict)
        self.received.setdefault(attempt.headers["webhook-id"], []).append(body)

    def kinds(self) -> list[tuple[str, str]]:
        """(event type, execution id) of every event received, each once."""
        return [
            (bodies[0]["type"], bodies[0]["data"]["execution_id"])
            for bodies in self.received.values()
        ]

    def dump(self) -> str:
        return json.dumps(self.received, sort_keys=True)
