"""The scenario catalog: what clients do, written so it can start over after any crash.

A scenario's `drive` is run from the top again after each crash and restart, as a client
would retry: what it learned before the crash (an execution id) is in `client.memory`; what
it did not learn it does again. Drives never assert on the server's internals; they only
check that each answer is one a client may legitimately get. The invariants are checked by
the sweep, on what the database and the tools' logs hold afterwards.

This module holds the `Scenario` type and the catalog, in the order the sweep runs it. The
drives live by what they exercise: `simulation.scenario_runs` (executions and approvals),
`simulation.scenario_recovery` (restarts, cut-off calls, a lease taken over),
`simulation.scenario_drains` (a drain and a shutdown), `simulation.scenario_sessions`
(sessions and the ledger), `simulation.concurrency` (gated interleavings of several
instances) and `simulation.clock` (only time passing); the steps they share are in
`simulation.scenario_steps`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from lockgate.simulation.clock import approval_deadline, instance_lease, session_cap, session_idle
from lockgate.simulation.concurrency import (
    one_decision_twice,
    stalled_at,
    two_recoverers,
    woken_before_recovery_commits,
)
from lockgate.simulation.http_notes import SOURCE as HTTP_SOURCE
from lockgate.simulation.scenario_drains import (
    SPIN_CODE,
    SPIN_ITERATIONS,
    drain_mid_run,
    drain_while_running,
    graceful_shutdown,
    spin_code,
)
from lockgate.simulation.scenario_people import (
    PEOPLE_MACHINES,
    PEOPLE_SETTINGS,
    approver_removed,
    links_and_sessions_end,
    person_enrols_and_decides,
    person_signs_in_and_out,
)
from lockgate.simulation.scenario_questions import (
    tool_asks,
    tool_asks_cancelled,
    tool_asks_expired,
)
from lockgate.simulation.scenario_recovery import (
    conservative_approval,
    conservative_recovery,
    in_doubt_idempotent,
    in_doubt_non_idempotent,
    lease_takeover,
    left_by_an_earlier_version,
    resume_after_restart,
)
from lockgate.simulation.scenario_runs import (
    approval_accepted,
    approval_cancelled,
    approval_declined,
    approval_expired,
    blocked_by_policy,
    concurrent_resume,
    duplicate_resume,
    execution_cancelled,
    failing_code,
    leaky_tools,
    plain,
    several_calls,
)
from lockgate.simulation.scenario_sessions import (
    session_closed,
    session_lease,
    session_log_level,
    session_requests,
    stream_lost,
)
from lockgate.simulation.scenario_steps import WRITE_THEN_READ, decide, started
from lockgate.simulation.scenario_webhooks import (
    approval_warned,
    webhook_abandoned,
    webhook_delivered,
)
from lockgate.simulation.webhook_endpoint import WEBHOOK_SETTINGS
from lockgate.simulation.world import Client, ScenarioFailed, expect

# What other modules import from here (the drain's spinning code and steps for the harness
# and older imports), besides the catalog itself.
__all__ = [
    "CATALOG",
    "OVER_HTTP",
    "SPIN_CODE",
    "SPIN_ITERATIONS",
    "WRITE_THEN_READ",
    "Drive",
    "Scenario",
    "ScenarioFailed",
    "by_name",
    "decide",
    "drain_mid_run",
    "expect",
    "spin_code",
    "started",
]

Drive = Callable[[Client], None]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    drive: Drive
    #: Settings every incarnation of this scenario boots with.
    settings: dict[str, Any] = field(default_factory=dict)
    #: Drives only through execute/resume/get, so the same drive runs against real processes
    #: (the others have a real-process drive of their own in `simulation.remote`).
    portable: bool = True
    #: Settings the real-process servers add (real time must cross the scenario's bounds).
    real_process_settings: dict[str, str] = field(default_factory=dict)
    #: Its notes calls go over HTTP, through the OpenAPI source (`simulation.http_notes`).
    over_http: bool = False
    #: The lifecycles it is about: only their crash points are planned (None: every one it
    #: reaches). For a scenario that passes through an execution only to reach its own
    #: lifecycles, whose execution's points the execution's own scenarios crash already.
    crash_only: frozenset[str] | None = None


#: The scenarios made again with their calls over HTTP, through the OpenAPI source: between
#: them they reach every crash point of the tool call lifecycle with an OpenAPI call (a
#: test holds them to it), writes included, each counted by the API's own log.
OVER_HTTP = (
    "plain",
    "several_calls",
    "approval_accepted",
    "approval_declined",
    "execution_cancelled",
    "approval_expired",
    "blocked_by_policy",
    "in_doubt_idempotent",
    "in_doubt_non_idempotent",
    "conservative_recovery",
    "conservative_approval",
    "left_by_an_earlier_version_conservative",
)


def over_http(scenario: Scenario) -> Scenario:
    """`scenario` with its notes calls made over HTTP (`tools.api.*`), its policy's rules
    naming the same tools of that source."""
    settings = dict(scenario.settings)
    if "policy" in settings:
        settings["policy"] = str(settings["policy"]).replace("notes.", f"{HTTP_SOURCE}.")
    return replace(
        scenario,
        name=f"{scenario.name}_http",
        description=f"{scenario.description} Over HTTP, through the OpenAPI source.",
        settings=settings,
        portable=False,
        over_http=True,
    )


_STALLS = (
    ("before_dispatch", "tool_call:dispatch:approved->dispatched:before_commit"),
    ("after_dispatch", "tool_call:dispatch:approved->dispatched:after_commit"),
    ("before_succeed", "tool_call:succeed:dispatched->succeeded:before_commit"),
    ("before_complete", "execution:complete:running->completed:before_commit"),
)
_WRITE_APPROVED = {"policy": "notes.write=approve"}

_CATALOG: tuple[Scenario, ...] = (
    Scenario("plain", "A run with one auto-approved call.", plain),
    Scenario("several_calls", "Several calls, one failing inside the code.", several_calls),
    Scenario("failing_code", "Code that raises after a call.", failing_code),
    Scenario("leaky_tools", "Tools that leak their secret everywhere they can.", leaky_tools),
    Scenario("approval_accepted", "A write paused for approval, accepted.", approval_accepted),
    Scenario("approval_declined", "Declined; the code catches it.", approval_declined),
    Scenario("approval_cancelled", "Cancelled; the code catches it.", approval_cancelled),
    Scenario(
        "execution_cancelled",
        "A paused and a queued run cancelled.",
        execution_cancelled,
        portable=False,
    ),
    Scenario(
        "approval_expired",
        "Nobody decides before the deadline.",
        approval_expired,
        real_process_settings={"approval_ttl": "2"},
        portable=False,
    ),
    Scenario(
        "tool_asks",
        "A tool asks its user two things; answered one at a time, then it writes.",
        tool_asks,
    ),
    Scenario(
        "tool_asks_cancelled",
        "A tool asks its user; the execution is cancelled while it waits.",
        tool_asks_cancelled,
    ),
    Scenario(
        "tool_asks_expired",
        "A tool asks its user; nobody answers before the deadline.",
        tool_asks_expired,
        portable=False,
        real_process_settings={"approval_ttl": "2"},
    ),
    Scenario(
        "blocked_by_policy",
        "A call the policy blocks.",
        blocked_by_policy,
        settings={"policy": "notes.delete=block"},
    ),
    Scenario("duplicate_resume", "The same decision sent twice.", duplicate_resume),
    Scenario("concurrent_resume", "Two resumes at once.", concurrent_resume),
    Scenario(
        "resume_after_restart",
        "Resumed by a later incarnation.",
        resume_after_restart,
        portable=False,
    ),
    Scenario(
        "in_doubt_idempotent",
        "A read-only call that needed approval, cut off mid-dispatch.",
        in_doubt_idempotent,
        settings={"policy": "notes.list=require_approval"},
    ),
    Scenario(
        "in_doubt_non_idempotent",
        "A write (approved by policy) cut off.",
        in_doubt_non_idempotent,
        settings={"policy": "notes.write=approve"},
    ),
    Scenario(
        "conservative_recovery",
        "Every cut-off run ends interrupted.",
        conservative_recovery,
        settings={"conservative_recovery": True},
    ),
    Scenario(
        "conservative_approval",
        "Retries off; a write approved by a person, then cut off.",
        conservative_approval,
        settings={"conservative_recovery": True},
    ),
    Scenario(
        "left_by_an_earlier_version",
        "A call's row an earlier version committed alone, found after the crash.",
        left_by_an_earlier_version,
        portable=False,
    ),
    Scenario(
        "left_by_an_earlier_version_conservative",
        "The same, with retries off: the run ends interrupted, the call withdrawn.",
        left_by_an_earlier_version,
        settings={"conservative_recovery": True},
        portable=False,
    ),
    Scenario(
        "lease_takeover",
        "Two instances; a's lease lapses.",
        lease_takeover,
        # The real-process drive stalls a mid-write: the write must not wait for a person.
        real_process_settings={"policy": "notes.write=approve"},
        portable=False,
    ),
    Scenario(
        "graceful_shutdown", "An instance drains and stops.", graceful_shutdown, portable=False
    ),
    Scenario(
        "drain_while_running",
        "SIGTERM while code runs: handed back, run again by the next incarnation.",
        drain_while_running,
        portable=False,
        # Real time: a longer run to catch (its limit raised to match), a short drain bound.
        real_process_settings={"max_duration_secs": "30", "drain_timeout": "3"},
    ),
    *(
        Scenario(
            f"stalled_{where}",
            f"a stalls at {point}; b recovers its work; then a wakes up.",
            stalled_at(point),
            settings=_WRITE_APPROVED,
            portable=False,
        )
        for where, point in _STALLS
    ),
    Scenario(
        "two_recoverers",
        "b and c recover a's work at once (b held before its requeue commits).",
        two_recoverers,
        settings=_WRITE_APPROVED,
        portable=False,
    ),
    Scenario(
        "woken_before_recovery_commits",
        "a wakes and dispatches between b's read of the journal and b's requeue commit.",
        woken_before_recovery_commits,
        portable=False,
        # The real-process drive is the stall before a dispatch the policy approves.
        real_process_settings={"policy": "notes.write=approve"},
    ),
    Scenario(
        "approval_deadline",
        "Only the clock moves: a paused run before, at and after its deadline.",
        approval_deadline,
        real_process_settings={"approval_ttl": "2"},
        portable=False,
    ),
    Scenario(
        "instance_lease",
        "Only the clock moves: a stalled instance before, at and after its lease ends.",
        instance_lease,
        settings=_WRITE_APPROVED,
        portable=False,
    ),
    Scenario(
        "session_idle",
        "Only the clock moves: an idle session before, at and after its idle timeout.",
        session_idle,
        real_process_settings={"session_idle_timeout": "2"},
        portable=False,
    ),
    Scenario(
        "session_cap",
        "Only the clock moves: a session with a request owed, at and around its cap.",
        session_cap,
        real_process_settings={
            "session_idle_timeout": "1",
            "session_lease": "1",
            "session_cap": "3",
        },
        portable=False,
    ),
    Scenario(
        "one_decision_twice",
        "Two resumes with one decision on two instances, the first held before it commits.",
        one_decision_twice,
        portable=False,
    ),
    Scenario(
        "session_requests",
        "Requests on a durable session: owed, answered; lost ones reported on the next GET.",
        session_requests,
        portable=False,
    ),
    Scenario(
        "session_closed", "DELETE on an active and an idle session.", session_closed, portable=False
    ),
    Scenario(
        "session_log_level",
        "logging/setLevel on an active and an idle session: the last level is kept.",
        session_log_level,
        portable=False,
    ),
    Scenario(
        "stream_lost",
        "A stream ends without its answer: -32010 on it.",
        stream_lost,
        portable=False,
    ),
    Scenario(
        "session_lease",
        "Idle and capped sessions expire; reports left uncollected.",
        session_lease,
        real_process_settings={"session_idle_timeout": "2", "session_cap": "3"},
        portable=False,
    ),
    Scenario(
        "webhook_delivered",
        "A call paused for approval: its signed event reaches the operator's endpoint.",
        webhook_delivered,
        settings=WEBHOOK_SETTINGS,
        portable=False,
    ),
    Scenario(
        "webhook_abandoned",
        "The endpoint is down: the event is retried with backoff, then abandoned.",
        webhook_abandoned,
        settings={**WEBHOOK_SETTINGS, "webhook_max_attempts": 2},
        portable=False,
    ),
    Scenario(
        "approval_warned",
        "Nobody decides: a warning goes out before the approval expires.",
        approval_warned,
        settings=WEBHOOK_SETTINGS,
        portable=False,
    ),
    Scenario(
        "person_enrols_and_decides",
        "A person registers a passkey with an enrolment link, then accepts a paused write.",
        person_enrols_and_decides,
        settings=PEOPLE_SETTINGS,
        portable=False,
        crash_only=PEOPLE_MACHINES,
    ),
    Scenario(
        "person_signs_in_and_out",
        "An enrolled person signs in anew, declines a paused write and signs out.",
        person_signs_in_and_out,
        settings=PEOPLE_SETTINGS,
        portable=False,
    ),
    Scenario(
        "links_and_sessions_end",
        "A newer link revokes the old; a session and a link outlive their lifetimes.",
        links_and_sessions_end,
        settings=PEOPLE_SETTINGS,
        portable=False,
    ),
    Scenario(
        "approver_removed",
        "A person with a session and an unused link is removed.",
        approver_removed,
        settings=PEOPLE_SETTINGS,
        portable=False,
    ),
)


CATALOG: tuple[Scenario, ...] = _CATALOG + tuple(
    over_http(s) for s in _CATALOG if s.name in OVER_HTTP
)


def by_name(name: str) -> Scenario:
    for scenario in CATALOG:
        if scenario.name == name:
            return scenario
    known = ", ".join(s.name for s in CATALOG)
    raise KeyError(f"no scenario {name!r}; known: {known}")
