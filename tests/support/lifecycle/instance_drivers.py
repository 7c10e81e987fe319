"""How the harness makes the instance lifecycle's events happen.

`InstanceActions` does what an operator, a supervisor or time does to an instance: a
maintenance round (heartbeat, recovery, expiry sweep), a graceful restart or stop, a SIGTERM
while code runs, and losing an instance so that it is declared dead. The driver functions
below choose the action for one spec event; `tests.support.harness.DRIVERS` maps the events
to them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from lockgate.machine.runtime import Runtime
from lockgate.simulation.scenarios import drain_mid_run
from tests.support.lifecycle.choices import Choices, pick
from tests.support.lifecycle.client import Client
from tests.support.lifecycle.deployment import NAMES, PRINCIPAL, Deployment
from tests.support.lifecycle.programs import SPIN

if TYPE_CHECKING:
    from tests.support.harness import Harness


def _maintain(runtime: Runtime) -> None:
    runtime.maintain()


class InstanceActions:
    """An operator's and a supervisor's actions on the instances of the deployment."""

    def __init__(self, deployment: Deployment, client: Client) -> None:
        self.deployment = deployment
        self.client = client

    def heartbeat(self, data: Choices) -> None:
        """One maintenance round (heartbeat, recovery, expiry sweep) of an instance."""
        d = self.deployment
        runtime = d.pick_runtime(data)
        d.note(f"{runtime.settings.instance_name}: maintain")
        d.act(runtime, lambda: _maintain(runtime))

    def graceful_restart(self, data: Choices, *, allow_stop: bool = True) -> None:
        """SIGTERM: drain (the lease still renewed), stop, and (unless another instance stays
        up and the operator scales down) boot a new incarnation."""
        d = self.deployment
        runtime = d.pick_runtime(data)
        name = runtime.settings.instance_name
        scale_down = allow_stop and len(d.live) > 1 and pick(data, [False, True], "scale down")

        def restart() -> None:
            d.note(f"{name}: graceful {'stop' if scale_down else 'restart'}")
            runtime.maintain()
            runtime.drain()
            runtime.maintain()
            runtime.close()
            d.drop(runtime)
            if not scale_down:
                d.boot(name)

        d.act(runtime, restart)

    def drain_while_running(self, data: Choices) -> None:
        """SIGTERM while code runs: the drain stops the code and hands its execution back
        (pending, released); the instance restarts, and whichever instance claims the
        execution next runs it again from its checkpoint."""
        d = self.deployment
        runtime = d.pick_runtime(data)
        name = runtime.settings.instance_name

        def drain() -> None:
            d.note(f"{name}: {SPIN.name}, then SIGTERM while it runs")
            ex = runtime.engine.begin(PRINCIPAL, SPIN.code)
            self.client.executions.setdefault(ex.id, SPIN)
            d.note(f"{name}: {SPIN.name} is {ex.id}")
            drain_mid_run(runtime, ex)
            runtime.maintain()
            runtime.close()
            d.drop(runtime)
            d.boot(name)

        d.act(runtime, drain)

    def lose_instance(self, data: Choices) -> None:
        """An instance stops for good and is declared dead: by its own next incarnation, by
        another instance once its lease lapsed, or (still running, unaware) by another."""
        d = self.deployment
        victim = d.pick_runtime(data)
        name = victim.settings.instance_name
        other = next(n for n in NAMES if n != name)
        how = pick(data, ["restart", "takeover", "zombie"], "how it is declared dead")
        d.note(f"{name}: lost ({how})")
        if how == "restart":
            d.drop(victim)
            d.boot(name)
            return
        if how == "takeover":
            d.drop(victim)
        d.advance(victim.settings.lease_ttl + timedelta(seconds=1))
        survivor = d.live.get(other)
        if survivor is not None:
            survivor.maintain()
        if survivor is None or survivor.fenced.is_set():
            # Nobody else is up, or the other instance stalled too and was declared dead
            # meanwhile: a new incarnation of it boots, recovering.
            if survivor is not None:
                d.drop(survivor)
            d.boot(other)
        if how == "zombie" and d.live.get(name) is victim:
            victim.maintain()  # its next heartbeat finds it was declared dead
            if not victim.fenced.is_set():
                self.client.problems.append(f"{name} kept working after it was declared dead")


# -- the drivers -------------------------------------------------------------------------------


def heartbeat(h: Harness, data: Choices) -> None:
    h.instances.heartbeat(data)


def graceful_restart(h: Harness, data: Choices) -> None:
    h.instances.graceful_restart(data)


def lose_instance(h: Harness, data: Choices) -> None:
    h.instances.lose_instance(data)


def drain_while_running(h: Harness, data: Choices) -> None:
    h.instances.drain_while_running(data)


def clean_restart(h: Harness, data: Choices) -> None:
    """A clean restart of one instance (never scaling down)."""
    h.instances.graceful_restart(data, allow_stop=False)
