"""Where the harness's drivers get their choices from.

A driver never decides anything itself: it asks `pick` or `pick_int`, which draw from a
Hypothesis `DataObject` (so the draws shrink and print with a failure), choose with a seeded
`random.Random` (smoke runs), or, given None, take the first option (a deterministic walk).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

from hypothesis import strategies as st
from hypothesis.strategies import DataObject

T = TypeVar("T")

#: Where a driver's choices come from (see the module docstring).
Choices = DataObject | random.Random | None


def pick(data: Choices, options: Sequence[T], label: str) -> T:
    """One of `options`: drawn by Hypothesis, chosen at random, or the first."""
    if not options:
        raise ValueError(f"nothing to choose for {label}")
    if data is None:
        return options[0]
    if isinstance(data, random.Random):
        return data.choice(list(options))
    return data.draw(st.sampled_from(options), label=label)


def pick_int(data: Choices, low: int, high: int, label: str) -> int:
    if data is None:
        return low
    if isinstance(data, random.Random):
        return data.randint(low, high)
    return data.draw(st.integers(low, high), label=label)
