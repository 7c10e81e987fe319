"""Fewer of glibc's malloc arenas for the server process.

glibc gives a threaded process up to eight malloc arenas per core, and memory freed in one
arena is not reused by another: a server whose threads (the event loop, the database and
sandbox threads, the webhook senders) each allocated somewhere kept growing by about 2.5 MiB
per 1,000 paused executions, in memory nothing held (bench case 6). Two arenas keep it flat,
at no measurable cost in calls per second (bench case 3, an A/B alternating: within its
noise), since CPython allocates small objects itself, under the GIL.

Written by hand: glibc's `mallopt` is one C call, which no maintained package wraps.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping

#: `mallopt`'s parameter for the arena cap (`M_ARENA_MAX` in glibc's malloc.h).
M_ARENA_MAX = -8
#: The arenas the server keeps: the main one and one for every other thread.
ARENAS = 2


def cap_malloc_arenas(environ: Mapping[str, str] = os.environ) -> bool:
    """Cap this process's malloc arenas at `ARENAS` (inherited by processes it forks), unless
    the operator set `MALLOC_ARENA_MAX` (glibc reads it itself). Whether it was capped here:
    False off glibc (musl, macOS, Windows), where there are no such arenas to cap."""
    if "MALLOC_ARENA_MAX" in environ:
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # the process's own C library
    if mallopt is None:
        return False
    return bool(mallopt(M_ARENA_MAX, ARENAS))
