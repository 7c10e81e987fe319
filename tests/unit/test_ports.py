"""A port handed out is not handed out again while it is claimed, to this process or another."""

from __future__ import annotations

import subprocess
import sys

from lockgate.simulation.ports import free_port


def test_ports_handed_out_are_never_handed_out_again() -> None:
    # The kernel's own picks repeat within a few hundred (two servers, one port).
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)


def test_another_process_is_not_handed_a_claimed_port() -> None:
    mine = {free_port() for _ in range(150)}
    script = (
        "from lockgate.simulation.ports import free_port\n"
        "print(*[free_port() for _ in range(150)])"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    theirs = {int(port) for port in done.stdout.split()}
    assert len(theirs) == 150
    assert not mine & theirs
