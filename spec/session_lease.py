"""The session lease decision, as a pure function (declared with the session lifecycle).

An idle session is destroyed after the idle timeout. A session with work in flight (a running
execution, or a request this incarnation still owes an answer to) is kept, in bounded leases,
but never past the cap. Paused executions are durable and do NOT keep a session alive: they
belong to their principal and can be resumed from any session. Requests owed by a previous
incarnation are stale: they never extend a lease. Destroying a session leaves its executions
untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum


class Alarm(StrEnum):
    KEEP = "keep"
    EXTEND = "extend"
    DESTROY = "destroy"


@dataclass(frozen=True)
class LeaseDecision:
    alarm: Alarm
    #: When to look again (KEEP: when the idle timeout would pass; EXTEND: the lease's end).
    until: datetime | None = None


@dataclass(frozen=True)
class LeasePolicy:
    idle_timeout: timedelta = timedelta(minutes=5)
    #: One extension while work is in flight.
    lease: timedelta = timedelta(minutes=4)
    #: Never kept longer than this after its last activity, work or not.
    cap: timedelta = timedelta(minutes=15)


def decide_session_alarm(
    now: datetime,
    last_activity: datetime,
    running: int,
    paused: int,
    owed_in_current_incarnation: int,
    policy: LeasePolicy = LeasePolicy(),
) -> LeaseDecision:
    """keep | extend(until) | destroy for one session at `now`.

    `paused` is accepted (and ignored) on purpose: the caller need not know that paused
    executions do not count, and a test pins that they do not.
    """
    del paused  # durable: a paused execution is resumable from any session
    idle_for = now - last_activity
    if idle_for < policy.idle_timeout:
        return LeaseDecision(Alarm.KEEP, last_activity + policy.idle_timeout)
    cap_end = last_activity + policy.cap
    if (running > 0 or owed_in_current_incarnation > 0) and now < cap_end:
        return LeaseDecision(Alarm.EXTEND, min(cap_end, now + policy.lease))
    return LeaseDecision(Alarm.DESTROY)
