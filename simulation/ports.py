"""A free loopback port for a server about to be started (the simulator's real processes,
and the tests' servers and PostgreSQL): the one place that asks the kernel for one."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
