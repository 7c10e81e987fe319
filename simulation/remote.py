"""The real-process drive of every scenario, and which scenarios run for real at all.

Portable scenarios run their in-process drive through `RemoteClient` (MCP over HTTP with
the official client). Scenarios that drive the engine directly in process (threads, gates,
the simulated clock, several instances) have a drive in `REMOTE` that does the same thing to
real processes: `simulation.remote_single` (one instance: deadlines, restarts, drains),
`simulation.remote_ledger` (sessions over raw HTTP, `simulation.remote_session`) and
`simulation.remote_several` (stalls and instances on one database). The client itself is in
`simulation.remote_client`.
"""

from __future__ import annotations

from lockgate.simulation.remote_client import RemoteClient, RemoteDrive, RemoteView
from lockgate.simulation.remote_ledger import (
    session_closed,
    session_expires,
    session_lease,
    session_log_level,
    session_requests,
    stream_lost,
)
from lockgate.simulation.remote_session import SessionClient, SessionGone
from lockgate.simulation.remote_several import one_decision_twice, stalled
from lockgate.simulation.remote_single import (
    approval_expires,
    drain_while_running,
    graceful_shutdown,
    leaky_tools,
    questions_expire,
    resume_after_restart,
)
from lockgate.simulation.scenarios import CATALOG, OVER_HTTP, Scenario

# What the real-process runner and the tests import from here.
__all__ = [
    "IN_PROCESS_ONLY",
    "NO_CLIENT_DOOR",
    "REMOTE",
    "SEVERAL_INSTANCES",
    "RemoteClient",
    "RemoteDrive",
    "RemoteView",
    "SessionClient",
    "SessionGone",
    "remote_drive",
    "runnable",
]


#: The real-process drive of each scenario that cannot use its in-process one.
REMOTE: dict[str, RemoteDrive] = {
    "leaky_tools": leaky_tools,
    "approval_expired": approval_expires,
    "approval_deadline": approval_expires,
    "tool_asks_expired": questions_expire,
    "resume_after_restart": resume_after_restart,
    "lease_takeover": stalled("tool_call:dispatch:approved->dispatched:before_commit", kill=True),
    "instance_lease": stalled("tool_call:dispatch:approved->dispatched:before_commit"),
    "graceful_shutdown": graceful_shutdown,
    "drain_while_running": drain_while_running,
    "stalled_before_dispatch": stalled("tool_call:dispatch:approved->dispatched:before_commit"),
    "stalled_after_dispatch": stalled("tool_call:dispatch:approved->dispatched:after_commit"),
    "stalled_before_succeed": stalled("tool_call:succeed:dispatched->succeeded:before_commit"),
    "stalled_before_complete": stalled("execution:complete:running->completed:before_commit"),
    "two_recoverers": stalled(
        "tool_call:dispatch:approved->dispatched:before_commit", recoverers=("sim-b", "sim-c")
    ),
    # For real, the window is the stall race itself (the way it was found, under load):
    # b's read and commit are not held apart, so the drive is the stall before a dispatch.
    "woken_before_recovery_commits": stalled(
        "tool_call:dispatch:approved->dispatched:before_commit"
    ),
    "one_decision_twice": one_decision_twice,
    "session_requests": session_requests,
    "stream_lost": stream_lost,
    "session_closed": session_closed,
    "session_log_level": session_log_level,
    "session_idle": session_expires,
    "session_cap": session_expires,
    "session_lease": session_lease,
}

#: Scenarios with several server processes at once: they need a database server. On SQLite
#: one process's open transaction (a stalled one's, for minutes) locks every other out of the
#: file, which is why docs/deploying.md runs several instances on PostgreSQL only.
SEVERAL_INSTANCES = frozenset(
    {
        "lease_takeover",
        "instance_lease",
        "stalled_before_dispatch",
        "stalled_after_dispatch",
        "stalled_before_succeed",
        "stalled_before_complete",
        "two_recoverers",
        "woken_before_recovery_commits",
        "one_decision_twice",
    }
)

#: Scenarios no real interface can drive, and why.
NO_CLIENT_DOOR = {
    "execution_cancelled": "no client interface cancels a whole execution (only the engine "
    "does, in process); a decision of `cancel` is approval_cancelled",
    "left_by_an_earlier_version": "the database an earlier version left is made in process "
    "(a call's row committed alone); no client interface writes one",
    "left_by_an_earlier_version_conservative": "as left_by_an_earlier_version",
}


#: Scenarios run in process only, and why (not for want of a client interface).
IN_PROCESS_ONLY = {
    f"{name}_http": "its HTTP API lives in the simulator's process; a real server's gated "
    "OpenAPI write across SIGKILL is tests/processes/test_openapi_restart.py"
    for name in OVER_HTTP
} | {
    name: "its webhook endpoint lives in the simulator's process; a real server's outbox "
    "across SIGKILL, delivered to a real endpoint, is tests/processes/test_webhook_restart.py"
    for name in ("webhook_delivered", "webhook_abandoned", "approval_warned")
} | {
    name: "the person's authenticator lives in the simulator's process; a real server's "
    "enrolment link and session across SIGKILL are tests/processes/test_people_passkeys.py and "
    "tests/processes/test_people_oidc.py"
    for name in (
        "person_enrols_and_decides",
        "person_signs_in_and_out",
        "links_and_sessions_end",
        "approver_removed",
    )
}


def remote_drive(scenario: Scenario) -> RemoteDrive:
    if scenario.name in REMOTE:
        return REMOTE[scenario.name]
    if scenario.portable:
        drive = scenario.drive
        return lambda client: drive(client)  # type: ignore[arg-type]
    raise KeyError(f"scenario {scenario.name!r} has no real-process drive")


def runnable() -> list[Scenario]:
    return [s for s in CATALOG if s.name not in NO_CLIENT_DOOR and s.name not in IN_PROCESS_ONLY]
