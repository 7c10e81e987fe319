"""The session lease decision, table-tested."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from lockgate.spec.session_lease import Alarm, LeasePolicy, decide_session_alarm

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)


@pytest.mark.parametrize(
    ("idle", "running", "paused", "owed", "alarm", "until"),
    [
        # Recently active: kept until the idle timeout would pass.
        (0 * MIN, 0, 0, 0, Alarm.KEEP, T0 + 5 * MIN),
        (4 * MIN, 0, 3, 0, Alarm.KEEP, T0 + 5 * MIN),
        # Idle past the timeout with nothing in flight: destroyed.
        (5 * MIN, 0, 0, 0, Alarm.DESTROY, None),
        # Paused executions are durable: they do not keep a session alive.
        (6 * MIN, 0, 5, 0, Alarm.DESTROY, None),
        # Work in flight extends it, in bounded leases...
        (6 * MIN, 1, 0, 0, Alarm.EXTEND, T0 + 10 * MIN),
        (6 * MIN, 0, 0, 2, Alarm.EXTEND, T0 + 10 * MIN),
        # ...never past the cap (15 min after the last activity).
        (13 * MIN, 1, 0, 0, Alarm.EXTEND, T0 + 15 * MIN),
        (15 * MIN, 1, 0, 1, Alarm.DESTROY, None),
        (40 * MIN, 3, 0, 0, Alarm.DESTROY, None),
    ],
)
def test_decide_session_alarm(
    idle: timedelta, running: int, paused: int, owed: int, alarm: Alarm, until: datetime | None
) -> None:
    decision = decide_session_alarm(T0 + idle, T0, running, paused, owed)
    assert (decision.alarm, decision.until) == (alarm, until)


def test_defaults_are_configurable() -> None:
    policy = LeasePolicy(idle_timeout=MIN, lease=MIN, cap=3 * MIN)
    assert decide_session_alarm(T0 + 2 * MIN, T0, 1, 0, 0, policy).until == T0 + 3 * MIN
    assert decide_session_alarm(T0 + 3 * MIN, T0, 1, 0, 0, policy).alarm is Alarm.DESTROY
