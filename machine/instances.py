"""This process's incarnation: an instance row with a heartbeat lease.

Every start is a new incarnation with a global, increasing number. The lease is renewed by
the `heartbeat` transition; when it lapses, any instance may declare this one dead and
recover its work. A heartbeat that finds the row already declared dead means another
instance took our work over: this process must stop touching it (its writes would conflict
anyway, since every write is conditional on a version).
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable, Collection
from datetime import UTC, datetime, timedelta

from lockgate.machine.db.errors import ConstraintViolation
from lockgate.machine.db.schema import Instance
from lockgate.machine.db.store import SqlStore
from lockgate.machine.errors import Conflict, GuardRefused, IllegalTransition
from lockgate.machine.records import RowRecord
from lockgate.machine.write_path import Step, WritePath
from lockgate.spec import INSTANCE
from lockgate.spec import InstanceStatus as I


def _record(row: Instance) -> RowRecord[Instance]:
    return RowRecord.of("instance", row)


class InstanceLease:
    def __init__(
        self,
        store: SqlStore,
        write: WritePath,
        *,
        name: str,
        ttl: timedelta,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store, self.write, self.name, self.ttl, self.clock = store, write, name, ttl, clock
        self.row: Instance | None = None
        self.record: RowRecord[Instance] | None = None
        #: The lease row is written from the maintenance thread and on shutdown.
        self._lock = threading.Lock()

    @property
    def id(self) -> str:
        if self.row is None:
            raise RuntimeError("the instance is not registered yet")
        return self.row.id

    @property
    def incarnation(self) -> int:
        if self.row is None:
            raise RuntimeError("the instance is not registered yet")
        return self.row.incarnation

    def register(self) -> Instance:
        """Insert this incarnation's row (live, with a fresh lease)."""
        for _ in range(20):
            latest = self.store.instances.latest_incarnation()
            now = self.clock()
            row = Instance(
                id=uuid.uuid4().hex,
                name=self.name,
                incarnation=(latest or 0) + 1,
                status=I.LIVE.value,
                host=socket.gethostname()[:200],
                pid=os.getpid(),
                started_at=now,
                lease_until=now + self.ttl,
            )
            try:
                self.write.create("instance", row)
            except ConstraintViolation:
                continue  # another instance took that incarnation number: take the next
            self.row, self.record = row, _record(row)
            return row
        raise RuntimeError("could not allocate an incarnation number")

    def _refresh(self) -> RowRecord[Instance]:
        """Re-read this incarnation's row (another thread of this process may have moved it:
        a drain racing a heartbeat is not a death)."""
        row = self.store.instances.get(self.id)
        assert row is not None
        self.record = _record(row)
        return self.record

    def heartbeat(self) -> bool:
        """Renew the lease; False when this incarnation was declared dead (or stopped)."""
        if self.record is None:
            raise RuntimeError("the instance is not registered yet")
        with self._lock:
            for _ in range(2):
                record = self.record
                assert record is not None
                try:
                    self.write.apply(
                        Step(record, "heartbeat", {"lease_until": self.clock() + self.ttl})
                    )
                    return True
                except (Conflict, GuardRefused, IllegalTransition):
                    if self._refresh().status not in (I.LIVE, I.DRAINING):
                        return False  # declared dead by another instance, or stopped
            return False

    def drain(self) -> None:
        with self._lock:
            if self.record is not None and self._refresh().status == I.LIVE:
                self.write.apply(Step(self.record, "drain"))

    def stop(self) -> None:
        with self._lock:
            if self.record is not None and self._refresh().status == I.DRAINING:
                self.write.apply(Step(self.record, "stop"))

    def live_ids(self, now: datetime | None = None) -> set[str]:
        """Instances whose lease still holds at `now` (this one included)."""
        return self.store.instances.holding_lease(now or self.clock())

    def dead_among(self, incarnations: Collection[int]) -> set[int]:
        """Those of `incarnations`, other than this one, that hold no lease any more
        (stopped, dead, or lapsed): what they owed clients and the sessions they served are
        for this one to recover. Reads only their rows, and nothing when all are this one's
        (the common case: it runs at every request of a 2025 session)."""
        others = set(incarnations) - {self.incarnation}
        if not others:
            return set()
        now = self.clock()
        alive = INSTANCE.live_names  # live or draining: its lease still counts
        return {
            lease.incarnation
            for lease in self.store.instances.leases_of(others)
            if lease.status not in alive or lease.lease_until <= now
        }

    def declare_dead_instances(self, now: datetime | None = None) -> list[str]:
        """Declare dead every instance whose lease lapsed by `now`, and every earlier
        incarnation of this instance's own name (a process cannot outlive its restart);
        returns their ids."""
        now = now or self.clock()
        declared = []
        for row in self.store.instances.alive_except(self.id):
            previous_self = row.name == self.name and row.incarnation < self.incarnation
            if row.lease_until > now and not previous_self:
                continue
            try:
                self.write.apply(Step(_record(row), "declare_dead"))
            except (Conflict, GuardRefused):
                continue  # another instance declared it first, or it renewed just now
            declared.append(row.id)
        return declared
