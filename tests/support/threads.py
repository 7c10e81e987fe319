"""Work on a thread of its own, for tests that act while it runs (the drain, races staged
with gates): its result or its exception handed back to the test's thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

#: A bound on a thread that never ends (a test bug), not a way to order events.
JOIN_LIMIT_SECS = 60.0


class InThread:
    """`work` on a thread of its own; `result()` joins it and returns or re-raises.

    `on_end` runs when the work ends, however it ends: it releases whatever the test waits
    on for this thread (a gate's `give_up`, an event's `set`), so a thread that fails before
    it gets there fails the test at once instead of after the wait's bound."""

    def __init__(self, work: Callable[[], Any], on_end: Callable[[], Any] = lambda: None) -> None:
        self._box: dict[str, Any] = {}

        def run() -> None:
            try:
                self._box["value"] = work()
            except BaseException as exc:  # handed to the test's thread
                self._box["error"] = exc
            finally:
                on_end()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def result(self) -> Any:
        self._thread.join(JOIN_LIMIT_SECS)
        assert not self._thread.is_alive(), "the thread never finished"
        if "error" in self._box:
            raise self._box["error"]
        return self._box["value"]
