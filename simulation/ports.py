"""A free loopback port for a server about to be started (the simulator's real processes,
and the tests' servers and PostgreSQL): the one place that asks the kernel for one.

The kernel's pick is free now, not when the server binds it a moment later: two processes
that each ask (two test workers, the simulator beside them) can be handed the same port,
and the second server then fails to bind while a client of it reaches the first, which
knows none of its keys. So each port handed out is claimed, for the machine, by a file in
a folder of this user's: a port with a claim younger than `CLAIM_SECS` is not handed out
again, whoever asks.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from pathlib import Path

#: How long a port handed out stays claimed: longer than any test or run holds a port it
#: has not bound yet (a restart on a dead server's port reuses its own, unclaimed).
CLAIM_SECS = 900.0
#: Picks before giving up (each skips a claimed port; the kernel has thousands).
ATTEMPTS = 200


def claims_folder() -> Path:
    return Path(tempfile.gettempdir()) / f"lockgate-ports-{os.getuid()}"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel picks it), and that
    no other process was handed within `CLAIM_SECS`."""
    folder = claims_folder()
    folder.mkdir(mode=0o700, exist_ok=True)
    for _ in range(ATTEMPTS):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        claim = folder / str(port)
        try:
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            # Claimed by someone: never taken over here (two takers of one stale claim
            # would both think it theirs); a stale one is only cleared for a later pick.
            try:
                if time.time() - claim.stat().st_mtime > CLAIM_SECS:
                    claim.unlink()
            except FileNotFoundError:
                pass
            continue
        return port
    raise RuntimeError(f"no unclaimed loopback port in {ATTEMPTS} picks (see {folder})")
