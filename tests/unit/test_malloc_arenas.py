"""The server caps glibc's malloc arenas (`server/malloc_arenas.py`): threads that allocate at
once share two arenas instead of one each, unless the operator chose with MALLOC_ARENA_MAX.
Counted in a fresh process (arenas are per process and never go away) from glibc's own
account of its heaps (`malloc_info`)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from lockgate.server.malloc_arenas import ARENAS, cap_malloc_arenas

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="malloc arenas are glibc's",
)

# Eight threads allocate at the same moment, then glibc describes its heaps: one
# `<heap nr=...>` per arena.
ARENAS_AFTER_THREADS = """
import ctypes, os, sys, tempfile, threading
from lockgate.server.malloc_arenas import cap_malloc_arenas
print(cap_malloc_arenas())
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
barrier = threading.Barrier(8)
def allocate():
    barrier.wait()
    blocks = [libc.malloc(4096) for _ in range(200)]
    barrier.wait()
    for block in blocks:
        libc.free(block)
threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
libc.fopen.restype = ctypes.c_void_p
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
path = tempfile.mktemp()
stream = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, stream)
libc.fclose(stream)
print(open(path).read().count("<heap nr="))
os.unlink(path)
"""


def _arenas(environ: dict[str, str]) -> tuple[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", ARENAS_AFTER_THREADS],
        env=environ,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    capped, heaps = done.stdout.split()
    return capped, int(heaps)


def test_threads_allocating_at_once_share_two_arenas() -> None:
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    capped, heaps = _arenas(environ)
    assert capped == "True"
    assert heaps <= ARENAS


def test_the_operators_malloc_arena_max_is_left_to_glibc() -> None:
    assert cap_malloc_arenas({"MALLOC_ARENA_MAX": "4"}) is False
    capped, heaps = _arenas({**os.environ, "MALLOC_ARENA_MAX": "4"})
    assert capped == "False"
    assert 2 < heaps <= 4
