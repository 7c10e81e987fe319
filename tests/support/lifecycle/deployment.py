"""The simulated deployment the harness drives: its instances, their crashes and their boots.

`Deployment` holds a `World` (a SQLite file in a work directory, the notes tools' data, a
`SimClock`, the fault injector), the incarnation of every instance that is up, and the trace
of what the harness did. Every client or operator action runs through `act`: when an armed
crash point fires, the process died, so the instance is dropped and a new incarnation boots
(recovering on boot), the way a supervisor would restart it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from sqlalchemy import Engine

from lockgate.machine.db.connect import open_engine
from lockgate.machine.faults import InjectedCrash
from lockgate.machine.runtime import Runtime
from lockgate.simulation.world import LogCapture, World
from lockgate.spec import CrashPoint
from tests.support.lifecycle.choices import Choices, pick

PRINCIPAL = "alice"
#: The instance names; a second one joins when a driver needs another instance.
NAMES = ("sim-a", "sim-b")
#: Short enough that the clock rule crosses it; long enough that a run rarely expires by
#: accident.
APPROVAL_TTL = timedelta(minutes=10)
#: Boots in a row that may crash (each armed point fires once, so this is never reached
#: unless the harness itself is broken).
MAX_BOOTS = 8


@dataclass
class CrashPlan:
    """What happens around the crash an action is armed for."""

    #: A second point armed once the first fired: it fires during the recovery, if reached.
    then: CrashPoint | None = None
    #: The incarnation that boots after the crash recovers conservatively.
    conservative: bool = False


class Deployment:
    """The world, the instances that are up, and the crashes armed around an action."""

    def __init__(self, workdir: Path, *, settings: Mapping[str, object] | None = None) -> None:
        self.world = World(
            workdir,
            settings={
                "policy": "notes.delete=block",
                "approval_ttl": APPROVAL_TTL,
                **(settings or {}),
            },
        )
        self.default_settings = dict(self.world.settings)
        self.clock = self.world.clock
        self.faults = self.world.faults
        #: Instance name -> its current incarnation, for every instance that is up.
        self.live: dict[str, Runtime] = {}
        #: What the harness did, for failure reports.
        self.trace: list[str] = []
        self.crashes = 0
        self._plan: CrashPlan | None = None
        # Every log line of the run, for the invariant that no secret reaches the logs.
        self.capture = LogCapture()
        root = logging.getLogger()
        self._root_level = root.level
        root.addHandler(self.capture)
        root.setLevel(logging.DEBUG)
        self.db: Engine | None = None
        try:
            self.boot(NAMES[0])
            self.db = open_engine(self.world.database_url)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        root = logging.getLogger()
        root.removeHandler(self.capture)
        root.setLevel(self._root_level)
        self.world.close()
        self.live.clear()
        if self.db is not None:
            self.db.dispose()
            self.db = None

    @property
    def engine(self) -> Engine:
        if self.db is None:
            raise RuntimeError("the harness is closed")
        return self.db

    @property
    def runtime(self) -> Runtime:
        """The first instance that is up."""
        return self.live[min(self.live)]

    def pick_runtime(self, data: Choices) -> Runtime:
        """The instance a request lands on (any instance may serve any request)."""
        return self.live[pick(data, sorted(self.live), "instance")]

    def note(self, line: str) -> None:
        self.trace.append(line)

    def advance(self, delta: timedelta) -> None:
        self.clock.advance(delta)
        self.note(f"clock +{delta}")

    # -- booting, crashing ---------------------------------------------------------------------

    def boot(self, name: str) -> Runtime:
        """A new incarnation of `name`, recovering on boot; a crash during the boot (an armed
        point reached by the recovery) is one more death, and the boot starts over."""
        for _ in range(MAX_BOOTS):
            conservative = self._plan.conservative if self._plan is not None else False
            self.world.settings = {**self.default_settings, "conservative_recovery": conservative}
            try:
                runtime = self.world.boot(name=name)
            except InjectedCrash as crash:
                self.note(f"CRASH during the boot of {name} at {crash.point.name}")
                self._crashed()
                continue
            finally:
                self.world.settings = dict(self.default_settings)
            self.live[name] = runtime
            self.note(f"booted {name} (incarnation {runtime.lease.incarnation})")
            return runtime
        raise RuntimeError(f"{name} crashed {MAX_BOOTS} times in a row while booting")

    def _crashed(self) -> None:
        """A crash fired: disarm everything (arming the plan's second point), and drop every
        runtime that is not up (one that crashed while booting)."""
        self.crashes += 1
        self.faults.armed.clear()
        self.faults.skip = 0
        if self._plan is not None and self._plan.then is not None:
            self.faults.armed.add(self._plan.then)
            self._plan.then = None
        up = set(map(id, self.live.values()))
        for runtime in list(self.world.runtimes):
            if id(runtime) not in up:
                self.world.abandon(runtime)

    def drop(self, runtime: Runtime) -> str:
        """Forget an incarnation that stopped (or died); its name, for booting it again."""
        name = runtime.settings.instance_name
        if self.live.get(name) is runtime:
            del self.live[name]
        self.world.abandon(runtime)
        return name

    def act(self, runtime: Runtime, action: Callable[[], None]) -> bool:
        """Run one action on `runtime`; if an armed point fires, the process died: boot a new
        incarnation of the same instance (it recovers on boot). False after a crash."""
        try:
            action()
        except InjectedCrash as crash:
            name = runtime.settings.instance_name
            self.note(f"CRASH of {name} at {crash.point.name}")
            self.drop(runtime)
            self._crashed()
            self.boot(name)
            return False
        return True

    @contextmanager
    def armed(
        self,
        points: Sequence[CrashPoint],
        *,
        skip: int = 0,
        then: CrashPoint | None = None,
        conservative: bool = False,
    ) -> Iterator[None]:
        """Arm `points` for the actions inside (the first one reached `skip` + 1 times fires);
        disarm whatever did not fire afterwards."""
        self.faults.armed.clear()
        self.faults.armed.update(points)
        self.faults.skip = skip
        self._plan = CrashPlan(then=then, conservative=conservative)
        what = ", ".join(p.name for p in points) if len(points) < 4 else f"{len(points)} points"
        self.note(f"armed {what} (skip {skip}, then {then}, conservative {conservative})")
        try:
            yield
        finally:
            self._plan = None
            self.faults.armed.clear()
            self.faults.skip = 0

    def run_background(self) -> None:
        """What the instances' background loops do between requests: an instance that learned
        it was declared dead is restarted by its supervisor, and pending work is run."""
        for name, runtime in list(self.live.items()):
            if runtime.fenced.is_set():
                self.note(f"{name} was fenced; its supervisor restarts it")
                self.drop(runtime)
                self.boot(name)
        if not self.live:
            self.boot(NAMES[0])
        for runtime in self.live.values():
            runtime.engine.run_pending()
