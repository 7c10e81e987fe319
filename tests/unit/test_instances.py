"""Instance leases (`machine/instances.py`) on the real store, with a fake clock: each start
is a new incarnation; the heartbeat renews the lease; a lapsed lease, or an earlier
incarnation of the same name, is declared dead by the others; drain and stop end it."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import timedelta

import pytest

from lockgate.machine.db.schema import Instance
from lockgate.machine.instances import InstanceLease
from lockgate.machine.records import RowRecord
from lockgate.machine.runtime import Runtime
from lockgate.machine.write_path import Step
from tests.support.sessions import FakeClock

MakeRuntime = Callable[..., Runtime]


def row(runtime: Runtime, instance_id: str) -> Instance:
    with runtime.engine.store.session() as s:
        found = s.get(Instance, instance_id)
    assert found is not None
    return found


def test_an_unregistered_lease_says_so(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    lease = InstanceLease(
        runtime.engine.store, runtime.engine.write, name="x", ttl=timedelta(seconds=5)
    )
    for use in (lambda: lease.id, lambda: lease.incarnation, lease.heartbeat):
        with pytest.raises(RuntimeError, match=r"^the instance is not registered yet$"):
            use()


def test_each_start_is_a_new_incarnation_with_a_fresh_lease(make_runtime: MakeRuntime) -> None:
    clock = FakeClock()
    first = make_runtime(clock=clock, instance_name="a", lease_ttl="30")
    second = make_runtime(clock=clock, instance_name="b", lease_ttl="30")
    assert second.lease.incarnation == first.lease.incarnation + 1
    stored = row(second, second.lease.id)
    assert (stored.name, stored.status, stored.incarnation) == ("b", "live", 2)
    assert stored.lease_until == clock.now + timedelta(seconds=30)
    assert stored.started_at == clock.now
    assert (stored.host, stored.pid) == (socket.gethostname()[:200], os.getpid())


def test_the_heartbeat_renews_the_lease(make_runtime: MakeRuntime) -> None:
    clock = FakeClock()
    runtime = make_runtime(clock=clock, lease_ttl="30")
    clock.advance(timedelta(seconds=20))
    assert runtime.lease.heartbeat() is True
    assert row(runtime, runtime.lease.id).lease_until == clock.now + timedelta(seconds=30)
    runtime.lease.drain()
    clock.advance(timedelta(seconds=20))
    assert runtime.lease.heartbeat() is True  # a draining instance keeps its lease
    stored = row(runtime, runtime.lease.id)
    assert stored.status == "draining"
    assert stored.lease_until == clock.now + timedelta(seconds=30)


def test_a_heartbeat_after_being_declared_dead_stops_the_instance(
    make_runtime: MakeRuntime,
) -> None:
    clock = FakeClock()
    late = make_runtime(clock=clock, instance_name="late", lease_ttl="10")
    other = make_runtime(clock=clock, instance_name="other", lease_ttl="60")
    clock.advance(timedelta(seconds=11))
    assert other.lease.declare_dead_instances() == [late.lease.id]
    assert late.lease.heartbeat() is False
    assert row(late, late.lease.id).status == "dead"


def test_a_heartbeat_from_a_stale_record_of_a_live_row_still_renews(
    make_runtime: MakeRuntime,
) -> None:
    """Another thread of this process moved the row (a drain): the heartbeat re-reads it
    and renews from the current version."""
    clock = FakeClock()
    runtime = make_runtime(clock=clock, lease_ttl="30")
    stale = runtime.lease.record
    runtime.lease.drain()
    runtime.lease.record = stale
    clock.advance(timedelta(seconds=5))
    assert runtime.lease.heartbeat() is True
    assert row(runtime, runtime.lease.id).lease_until == clock.now + timedelta(seconds=30)


def test_drain_then_stop(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime()
    instance_id = runtime.lease.id
    runtime.lease.stop()  # a live instance is not stopped without draining
    assert row(runtime, instance_id).status == "live"
    runtime.lease.drain()
    runtime.lease.drain()  # twice is harmless
    assert row(runtime, instance_id).status == "draining"
    runtime.lease.stop()
    assert row(runtime, instance_id).status == "stopped"
    assert instance_id not in runtime.lease.live_ids()


def test_live_ids_are_the_leases_holding_at_that_instant(make_runtime: MakeRuntime) -> None:
    clock = FakeClock()
    short = make_runtime(clock=clock, instance_name="short", lease_ttl="10")
    long = make_runtime(clock=clock, instance_name="long", lease_ttl="60")
    both = {short.lease.id, long.lease.id}
    assert long.lease.live_ids() == both
    assert long.lease.live_ids(clock.now + timedelta(seconds=9)) == both
    # A lease ending exactly now no longer holds.
    assert long.lease.live_ids(clock.now + timedelta(seconds=10)) == {long.lease.id}
    short.lease.drain()
    assert long.lease.live_ids() == both  # draining still holds its lease


def test_lapsed_leases_and_earlier_incarnations_are_declared_dead(
    make_runtime: MakeRuntime,
) -> None:
    clock = FakeClock()
    lapsing = make_runtime(clock=clock, instance_name="lapsing", lease_ttl="10")
    renewed = make_runtime(clock=clock, instance_name="renewed", lease_ttl="10")
    before_restart = make_runtime(clock=clock, instance_name="me", lease_ttl="60")
    me = make_runtime(clock=clock, instance_name="me", lease_ttl="60")
    assert me.lease.declare_dead_instances() == [before_restart.lease.id]  # its lease holds
    clock.advance(timedelta(seconds=5))
    assert renewed.lease.heartbeat()
    clock.advance(timedelta(seconds=5))  # lapsing's lease ends exactly now
    assert me.lease.declare_dead_instances() == [lapsing.lease.id]
    assert row(me, lapsing.lease.id).status == "dead"
    assert row(me, renewed.lease.id).status == "live"
    assert row(me, me.lease.id).status == "live"  # never itself
    assert me.lease.declare_dead_instances() == []  # nothing twice
    # An explicit instant is the one judged.
    later = clock.now + timedelta(seconds=6)
    assert me.lease.declare_dead_instances(later) == [renewed.lease.id]


def test_an_earlier_incarnation_never_declares_its_successor_dead(
    make_runtime: MakeRuntime,
) -> None:
    """A process that outlived its own restart (a long pause, a slow kill) still runs its
    maintenance round: it must not end the newer process of its name, whose lease holds and
    whose clients it serves; only the newer one ends the older."""
    clock = FakeClock()
    before_restart = make_runtime(clock=clock, instance_name="me", lease_ttl="60")
    me = make_runtime(clock=clock, instance_name="me", lease_ttl="60")
    assert before_restart.lease.declare_dead_instances() == []
    assert row(me, me.lease.id).status == "live"
    assert me.lease.heartbeat() is True
    assert me.lease.declare_dead_instances() == [before_restart.lease.id]
    assert before_restart.lease.heartbeat() is False


def test_an_instance_whose_own_lease_lapsed_never_declares_itself_dead(
    make_runtime: MakeRuntime,
) -> None:
    """A late heartbeat (a long pause of this process) is not a death: the next heartbeat
    renews the lease; only another instance may declare this one dead."""
    clock = FakeClock()
    runtime = make_runtime(clock=clock, lease_ttl="10")
    clock.advance(timedelta(seconds=30))
    assert runtime.lease.declare_dead_instances() == []
    assert row(runtime, runtime.lease.id).status == "live"
    assert runtime.lease.heartbeat() is True


def test_a_death_another_instance_declared_first_does_not_stop_the_rest(
    make_runtime: MakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two leases lapsed; between this instance's read and its write, another declares the
    first of them dead. Losing that race skips one row: the second is still declared (else
    its work waits a whole maintenance round longer for a recoverer)."""
    clock = FakeClock()
    first = make_runtime(clock=clock, instance_name="first", lease_ttl="10")
    second = make_runtime(clock=clock, instance_name="second", lease_ttl="10")
    me = make_runtime(clock=clock, instance_name="me", lease_ttl="60")
    other = make_runtime(clock=clock, instance_name="other", lease_ttl="60")
    clock.advance(timedelta(seconds=10))
    read = me.engine.store.instances.alive_except

    def raced(instance_id: str) -> list[Instance]:
        rows = sorted(read(instance_id), key=lambda r: r.name != "first")
        lapsed = row(other, first.lease.id)
        other.engine.write.apply(Step(RowRecord.of("instance", lapsed), "declare_dead"))
        return rows  # `first` as this instance read it, before the other declared it

    monkeypatch.setattr(me.engine.store.instances, "alive_except", raced)
    assert me.lease.declare_dead_instances() == [second.lease.id]
    assert row(me, first.lease.id).status == "dead"
    assert row(me, second.lease.id).status == "dead"
