"""Waiting on another process, by polling with a deadline (never a bare sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T], what: str, timeout: float = 20.0, interval: float = 0.05
) -> T:
    """Poll `condition` every `interval` seconds until it returns something truthy; fail
    naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)
