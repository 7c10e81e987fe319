"""The real-process drives of the scenarios with several instances on one database.

A stall is a server that SIGSTOPs itself at a crash point (`LOCKGATE_STOP_AT`): it stops
heartbeating, its lease lapses in real time (the deployment's leases are seconds long), the
other instances declare it dead and recover its execution; then it is resumed (SIGCONT) or
killed. A decision sent twice goes to two instances at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx2

from lockgate.machine.engine import Action
from lockgate.machine.errors import LockgateError
from lockgate.simulation.concurrency import STALLED_CODE
from lockgate.simulation.real_process import ProcessKilled, ServerProcess, until
from lockgate.simulation.remote_client import (
    SETTLED,
    RemoteClient,
    RemoteDrive,
    RemoteView,
    stored_status,
)
from lockgate.simulation.scenario_steps import WRITE_THEN_READ, at_once, started
from lockgate.simulation.world import ScenarioFailed, expect
from lockgate.spec import CrashPoint
from lockgate.spec import ExecutionStatus as E


def _other(client: RemoteClient, name: str) -> ServerProcess:
    server = client.deployment.servers.get(name)
    if server is None or server.proc.poll() is not None:
        server = client.deployment.start(name)
    return server


def stalled(
    point_name: str, *, recoverers: tuple[str, ...] = ("sim-b",), kill: bool = False
) -> RemoteDrive:
    """a stops itself at `point_name` mid-run (SIGSTOP: no heartbeat, its lease lapses);
    the other instances declare it dead and recover its execution; then a is resumed
    (SIGCONT) and goes on with what it read before, or (`kill`) never comes back."""
    point = CrashPoint.parse(point_name)

    def drive(client: RemoteClient) -> None:
        others = [_other(client, name) for name in recoverers]
        if client.memory.get("stall.done"):
            _settled(client, others[0])
            return
        a = client.server
        if "stall.started" not in client.memory:
            client.deployment.stop(a)
            client.memory["stall.started"] = True
            a = client.server = client.deployment.start(a.name, stop_at=point)
        answers: list[RemoteView] = []
        crashed: list[ProcessKilled] = []

        def run() -> None:
            try:
                answers.append(client.execute(STALLED_CODE, a))
            except ProcessKilled as killed:
                crashed.append(killed)
            except (LockgateError, ScenarioFailed, httpx2.HTTPError):
                pass  # a's answer after the stall: whatever it is, the invariants judge

        worker = threading.Thread(target=run)
        worker.start()
        killed = False
        try:
            until(
                lambda: a.stopped or not worker.is_alive() or _dead_other(client, a),
                f"{a.name} stops at {point.name}",
            )
            if a.stopped:
                until(
                    lambda: client.instance_status(a.name) == "dead" or _dead_other(client, a),
                    f"{a.name} is declared dead",
                )
                client.deployment.check_alive_except(a)
        finally:
            killed = a.stopped and kill
            if killed:
                a.kill()
                client.deployment.died(a, deliberate=True)
            elif a.stopped:
                a.resume()
            worker.join()
        if crashed and not killed:  # a died of its crash point, not of the harness's kill
            raise crashed[0]
        if answers:
            client.memory["e"] = answers[0].id
        client.memory["stall.done"] = True
        if killed:
            client.server = client.deployment.start(a.name)
        _settled(client, others[0])

    return drive


def _dead_other(client: RemoteClient, stalled: ServerProcess) -> bool:
    return any(
        s.proc.poll() is not None for s in client.deployment.servers.values() if s is not stalled
    )


def _settled(client: RemoteClient, server: ServerProcess) -> None:
    execution_id = client.memory.get("e")
    if execution_id is None:
        return
    until(
        lambda: stored_status(client, execution_id) in SETTLED or _dead_other(client, server),
        "the stalled instance's execution settles",
    )
    client.deployment.check_alive()
    final = client.get(execution_id, server)  # and the client is told exactly that
    expect(final.status in SETTLED, f"the stalled instance's execution is {final.status}")


def one_decision_twice(client: RemoteClient) -> None:
    b = _other(client, "sim-b")
    view = started(client, "e", WRITE_THEN_READ)  # type: ignore[arg-type]
    failures: list[BaseException] = []

    def resume(server: ServerProcess) -> Callable[[], None]:
        def run() -> None:
            try:
                client.resume(view.id, Action.ACCEPT, server)
            except LockgateError:
                pass  # already decided by the other: a legitimate answer
            except BaseException as exc:
                failures.append(exc)

        return run

    if not client.memory.get("decided"):
        at_once(resume(client.server), resume(b), failures=failures)
        client.memory["decided"] = True
    final = client.get(view.id, b)
    expect(final.status in (E.COMPLETED, E.INTERRUPTED), f"decided twice: {final.status}")
