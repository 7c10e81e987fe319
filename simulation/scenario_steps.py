"""The steps every scenario's drive is built of, safe to take again after any crash.

A drive starts over from the top after each crash and restart; these steps make that safe:
`started` submits code once and remembers the execution (its id under `key + ".id"`), and
`decide` resumes it as a client retries, taking an answer that says the execution moved on
as final. Both work on the in-process client and on `simulation.remote_client.RemoteClient`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from lockgate.machine.engine import Action
from lockgate.machine.execution_errors import (
    ExecutionAlreadySettled,
    ExecutionExpired,
    ExecutionInterrupted,
)
from lockgate.machine.views import ExecutionView
from lockgate.simulation.world import Client

WRITE_THEN_READ = 'tools.notes.write(key="k", text="v")\ntools.notes.read(key="k")'


def at_once(*work: Callable[[], None], failures: list[BaseException]) -> None:
    """Run each piece of `work` in a thread of its own, all at once, and wait for them;
    then raise the first failure they recorded (an injected crash in a thread is the
    process's death, re-raised in the driving thread)."""
    threads = [threading.Thread(target=w) for w in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


def decide(client: Client, key: str, action: Action) -> ExecutionView | None:
    """Resume as a client does: retrying the same decision is safe; an answer that says the
    execution moved on (settled, expired, interrupted) is final."""
    execution_id = client.memory.get(key)
    if execution_id is None:
        return None
    try:
        return client.resume(execution_id, action)
    except ExecutionAlreadySettled:
        return client.get(execution_id)
    except (ExecutionExpired, ExecutionInterrupted):
        return client.get(execution_id)


def started(client: Client, key: str, code: str) -> ExecutionView:
    view: ExecutionView = client.remember(key, lambda: client.execute(code))
    client.memory[key + ".id"] = view.id
    return view
