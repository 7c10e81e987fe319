"""The generic crash: any client or operator action, with a crash point of the spec armed.

The named crash drivers (`execution_drivers.crash_*`) arm the points one recovery edge needs;
this one arms any point of the driven lifecycles, or every point with the n-th one reached
firing, around any action, optionally with a second point armed for the recovery, so
crashes nobody thought of get tried too. The generated tests' `crash_and_restart` rule runs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from lockgate.spec import CrashPoint, MachineSpec, every_crash_point
from tests.support.lifecycle.choices import Choices, pick, pick_int
from tests.support.lifecycle.execution_drivers import (
    accept,
    answer_all,
    answer_one,
    cancel,
    decline,
    expire,
    run_asking,
    run_auto,
    run_blocked,
    run_failing,
    run_pausing,
    run_tool_failure,
)
from tests.support.lifecycle.instance_drivers import (
    drain_while_running,
    graceful_restart,
    heartbeat,
)
from tests.support.lifecycle.session_drivers import (
    close_session,
    expire_sessions,
    report_lost,
    session_request,
    stream_closed,
)
from tests.support.lifecycle.spec_replay import DRIVEN_MACHINES

if TYPE_CHECKING:
    from tests.support.harness import Driver, Harness


def _driven_points(machines: Mapping[str, MachineSpec]) -> list[CrashPoint]:
    return [p for m in DRIVEN_MACHINES if m in machines for p in every_crash_point(machines[m])]


#: Client and operator actions the generic crash rule runs with a point armed.
_ACTIONS: Mapping[str, Driver] = {
    "auto": run_auto,
    "failing": run_failing,
    "tool failure": run_tool_failure,
    "blocked": run_blocked,
    "pausing": run_pausing,
    "asking": run_asking,
    "answer one": answer_one,
    "answer all": answer_all,
    "accept": accept,
    "decline": decline,
    "cancel": cancel,
    "expire": expire,
    "heartbeat": heartbeat,
    "graceful restart": graceful_restart,
    "drain while running": drain_while_running,
    "session request": session_request,
    "stream closed": stream_closed,
    "collecting GET": report_lost,
    "DELETE": close_session,
    "sessions expire": expire_sessions,
}


def crash_anywhere(h: Harness, data: Choices) -> None:
    """The generic crash: a client or operator action with one crash point armed (drawn from
    the spec's points of the driven lifecycles), or crashing at the n-th point the action
    passes; optionally a second point armed for the recovery."""
    action = _ACTIONS[pick(data, list(_ACTIONS), "action")]
    points = _driven_points(h.machines)
    then = pick(data, [None, *points], "second crash, during the recovery")
    if pick(data, ["named point", "n-th point"], "where it crashes") == "named point":
        armed, skip = [pick(data, points, "crash point")], 0
    else:
        armed, skip = points, pick_int(data, 0, 15, "points passed before the crash")
    conservative = pick(data, [False, True], "conservative recovery")
    with h.deployment.armed(armed, skip=skip, then=then, conservative=conservative):
        action(h, data)
