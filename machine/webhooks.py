"""The webhook outbox: events about approvals, owed to the operator's endpoint, never lost.

Two events, each a `webhook_delivery` row (spec: `spec/webhook_delivery.py`):

- `approval.requested`: inserted in the pause's own transaction (`rows_for_pause`), so a
  paused call without its event, or an event without its pause, cannot exist after any crash;
- `approval.expiring`: inserted alone by the maintenance round (`warn_due`) once a paused
  call's deadline is within `LOCKGATE_APPROVAL_WARNING`.

Each row's id is derived from what it announces (`<kind>:<execution>:<call>`): the same event
is never queued twice (a second instance's warning for the same call is refused by the key),
and it is the `webhook-id` a receiver dedupes a redelivery on. Delivery (`deliver_due`, any
instance) claims a due row (moving its next attempt time past the attempt's bound), POSTs
the body signed (`machine.webhook_signing`), and commits `deliver` only after a 2xx: a crash
in between sends the event again, never loses it. A failure schedules a retry with
exponential backoff, until the last attempt abandons the row with its error.

The body says what a person needs to decide and where to go: the tool, the arguments (their
preview), the expiry, the call's approval page and the approvals inbox. It carries no
credential: the page's link names the call and authorises nothing (the person signs in
there), so a chat relay that posts it hands nobody a decision.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx2
from pydantic import JsonValue

from lockgate.machine.db.errors import ConstraintViolation
from lockgate.machine.db.schema import Execution, ToolCall, WebhookDelivery
from lockgate.machine.db.store import SqlStore
from lockgate.machine.errors import Conflict, GuardRefused
from lockgate.machine.records import RowRecord
from lockgate.machine.settings import Settings
from lockgate.machine.tools.http_calls import OPERATORS
from lockgate.machine.tools.outbound import guarded_transport
from lockgate.machine.webhook_signing import Signer
from lockgate.machine.write_path import Step, WritePath
from lockgate.spec import WebhookDeliveryStatus as W

log = logging.getLogger("lockgate.webhooks")

REQUESTED = "approval.requested"
EXPIRING = "approval.expiring"
#: The longest wait between two attempts.
MAX_BACKOFF = timedelta(hours=1)
#: A claim outlives its attempt's bound by this much (time to commit what it found).
CLAIM_MARGIN = timedelta(seconds=5)
#: What of an endpoint's answer the row keeps (and a log line shows).
ERROR_CHARS = 300
#: Rows one delivery round (or one warning round) takes on.
ROUND = 50


class DeliveryFailed(Exception):
    """The endpoint did not accept the event (the message says how)."""


@dataclass(frozen=True)
class Attempt:
    """One POST: where, the exact body, and its headers."""

    url: str
    body: bytes
    headers: dict[str, str]
    timeout: float


#: Sends one attempt; raises `DeliveryFailed` unless the endpoint answered 2xx.
Poster = Callable[[Attempt], None]


def post_over_http(attempt: Attempt) -> None:
    """The real POST: no redirects followed (a 3xx is a failure the operator must fix, not a
    hop to an address nobody configured), the answer read only for the error it names, the
    whole exchange within the attempt's bound (a receiver answering one byte a second is a
    timeout, not a held thread)."""
    transport = guarded_transport(OPERATORS, attempt.timeout, attempt.url)
    try:
        with httpx2.Client(
            transport=transport, timeout=attempt.timeout, follow_redirects=False
        ) as client:
            response = client.post(attempt.url, content=attempt.body, headers=attempt.headers)
    except httpx2.TimeoutException:
        raise DeliveryFailed(f"no answer within {attempt.timeout:g} s") from None
    except httpx2.HTTPError as exc:
        raise DeliveryFailed(f"the request failed ({type(exc).__name__})") from None
    if 300 <= response.status_code < 400:
        raise DeliveryFailed(
            f"HTTP {response.status_code}: redirects are not followed (set "
            "LOCKGATE_WEBHOOK_URL to the address it redirects to)"
        )
    if not 200 <= response.status_code < 300:
        excerpt = response.text[:ERROR_CHARS]
        raise DeliveryFailed(f"HTTP {response.status_code}: {excerpt}".strip())


def event_id(kind: str, execution_id: str, seq: int) -> str:
    return f"{kind}:{execution_id}:{seq}"


class WebhookOutbox:
    def __init__(
        self,
        *,
        store: SqlStore,
        write: WritePath,
        settings: Settings,
        clock: Callable[[], datetime],
        owner: str,
        post: Poster = post_over_http,
    ) -> None:
        self.store = store
        self.write = write
        self.settings = settings
        self.clock = clock
        self.owner = owner
        self.post = post
        self.signer = Signer.from_setting(settings.webhook_secret)
        #: The rows the delivery loop's pool is attempting now.
        self._in_flight: set[str] = set()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self.settings.webhook_url)

    # -- events --------------------------------------------------------------------------

    def _row(self, kind: str, ex: Execution, call: ToolCall, deadline: datetime) -> WebhookDelivery:
        now = self.clock()
        payload: dict[str, JsonValue] = {
            "type": kind,
            "timestamp": now.isoformat(),
            "data": {
                "principal": ex.principal_id,
                "execution_id": ex.id,
                "call": call.seq,
                "tool": call.tool,
                "arguments": call.arguments_preview,
                "expires_at": deadline.isoformat(),
                "approval_url": f"{self.settings.base_url}/approve/{ex.id}/{call.seq}",
                "approvals_url": f"{self.settings.base_url}/approvals",
            },
        }
        return WebhookDelivery(
            id=event_id(kind, ex.id, call.seq),
            kind=kind,
            principal_id=ex.principal_id,
            execution_id=ex.id,
            call_seq=call.seq,
            payload=payload,
            status=W.QUEUED,
            next_attempt_at=now,
            created_at=now,
        )

    def rows_for_pause(
        self, ex: Execution, call: ToolCall, deadline: datetime
    ) -> list[WebhookDelivery]:
        """What the pause of `call` inserts in its own transaction (nothing without an
        endpoint)."""
        if not self.enabled:
            return []
        return [self._row(REQUESTED, ex, call, deadline)]

    def warn_due(self) -> int:
        """Queue the warning of every paused call whose deadline is within the warning
        window and that has none yet; how many were queued."""
        window = self.settings.approval_warning
        if not self.enabled or window <= timedelta(0):
            return 0
        now = self.clock()
        queued = 0
        for ex, call in self.store.webhooks.expiring_unwarned(now, now + window, EXPIRING, ROUND):
            assert ex.deadline is not None  # the query reads only paused rows with one
            try:
                self.write.create("webhook_delivery", self._row(EXPIRING, ex, call, ex.deadline))
            except ConstraintViolation:
                continue  # another instance queued it first: one warning per call
            queued += 1
        return queued

    # -- delivery ------------------------------------------------------------------------

    def deliver_due(self, *, pool: Executor | None = None, at_once: int = 1) -> int:
        """Attempt the due rows (each claimed first, so no other instance sends it at the
        same time); how many were claimed. Alone, one after another; with `pool` (the
        delivery loop's), each in the pool while fewer than `at_once` are in flight, without
        waiting for them: a receiver that holds one event holds one thread, and the next
        round sends the others."""
        if not self.enabled:
            return 0
        room = at_once - len(self._in_flight) if pool is not None else ROUND
        claimed = [
            record
            for record in (
                RowRecord.of("webhook_delivery", row)
                for row in self.store.webhooks.due(self.clock(), max(room, 0))
            )
            if self._claim(record)
        ]
        for record in claimed:
            if pool is None:
                self._attempt(record)
                continue
            with self._lock:
                self._in_flight.add(record.id)
            pool.submit(self._attempt_in_pool, record)
        return len(claimed)

    def _attempt_in_pool(self, record: RowRecord[WebhookDelivery]) -> None:
        try:
            self._attempt(record)
        except Exception:
            log.exception(
                "delivering webhook %s failed; its claim lapses and it is retried", record.id
            )
        finally:
            with self._lock:
                self._in_flight.discard(record.id)

    def _claim(self, record: RowRecord[WebhookDelivery]) -> bool:
        bound = self.settings.webhook_timeout + CLAIM_MARGIN
        given = {"claimed_until": self.clock() + bound, "owner": self.owner}
        try:
            self.write.apply(Step(record, "claim", given))
        except (Conflict, GuardRefused):
            return False  # another instance claimed it, or it is not due any more
        return True

    def _attempt(self, record: RowRecord[WebhookDelivery]) -> None:
        row = record.typed
        body = json.dumps(row.payload, separators=(",", ":"), sort_keys=True).encode()
        attempt = Attempt(
            url=self.settings.webhook_url,
            body=body,
            # Wall time, not the runtime's clock: a receiver checks the timestamp against its
            # own clock (five minutes either way) to refuse a replay.
            headers=self.signer.headers(row.id, datetime.now(UTC), body),
            timeout=self.settings.webhook_timeout.total_seconds(),
        )
        try:
            self.write.apply(Step(record, "deliver"), effect=lambda: self.post(attempt))
            return
        except DeliveryFailed as failed:
            error = str(failed)[:ERROR_CHARS]
        except Conflict:
            # Its claim lapsed and another instance took it: that one settles the row (the
            # endpoint got the event from both, which at least once allows).
            return
        given: dict[str, object] = {
            "error": error,
            "max_attempts": self.settings.webhook_max_attempts,
            "retry_at": self.clock() + self.backoff(row.attempts),
        }
        try:
            self.write.apply(Step(record, "retry", given))
            log.warning("webhook %s attempt %d failed: %s", row.id, row.attempts, error)
        except GuardRefused:
            self.write.apply(Step(record, "abandon", given))
            log.error("webhook %s abandoned after %d attempts: %s", row.id, row.attempts, error)
        except Conflict:
            return

    def backoff(self, failed_before: int) -> timedelta:
        """The wait after the attempt that follows `failed_before` failed ones."""
        base: timedelta = self.settings.webhook_retry_base
        wait: timedelta = base * (2 ** min(failed_before, 20))
        return min(MAX_BACKOFF, wait)
