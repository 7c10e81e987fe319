"""The policy one principal's calls meet: the operator's `LOCKGATE_POLICY`, the global rules
stored in the database, and the principal's own, weighed together (most restrictive wins).

Stored rules are read through a small cache per principal, refreshed after
`policy_refresh_secs`, so a rule added by `lockgate policy add` on any instance takes effect
on every instance within that time without a database read per tool call. The cache holds at
most `CACHED_PRINCIPALS` principals (least recently used leave first): a server with many
principals keeps a bounded amount of memory.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from lockgate.machine.policy import Policy, PolicyDecision, PolicyRule

if TYPE_CHECKING:
    from lockgate.machine.db.schema import PolicyRuleRow
    from lockgate.machine.tools.spec import ToolSpec

#: The most principals whose stored rules are cached at once.
CACHED_PRINCIPALS = 1024


def rule_of(row: PolicyRuleRow) -> PolicyRule:
    return PolicyRule(
        pattern=row.pattern, decision=PolicyDecision(row.decision), condition=row.condition
    )


def with_stored(configured: Policy, rows: Sequence[PolicyRuleRow]) -> Policy:
    """The configured rules and the stored `rows`, weighed together."""
    return configured + Policy(rule_of(row) for row in rows)


class PolicyBook:
    def __init__(
        self,
        configured: Policy,
        stored: Callable[[str | None], Sequence[PolicyRuleRow]] | None = None,
        refresh_secs: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        #: The operator's `LOCKGATE_POLICY`: the same for every principal.
        self.configured = configured
        self._stored, self._refresh, self._clock = stored, refresh_secs, clock
        self._cache: OrderedDict[str, tuple[float, Policy]] = OrderedDict()
        self._lock = threading.Lock()

    def for_principal(self, principal: str | None) -> Policy:
        """Every rule that applies to `principal`'s calls (the configured ones alone when
        nothing is stored, or for no principal)."""
        if self._stored is None or principal is None:
            return self.configured
        now = self._clock()
        with self._lock:
            cached = self._cache.get(principal)
            if cached is not None and cached[0] > now:
                self._cache.move_to_end(principal)
                return cached[1]
        policy = with_stored(self.configured, self._stored(principal))
        with self._lock:
            self._cache[principal] = (now + self._refresh, policy)
            self._cache.move_to_end(principal)
            while len(self._cache) > CACHED_PRINCIPALS:
                self._cache.popitem(last=False)
        return policy

    def decide(self, spec: ToolSpec, principal: str | None = None) -> PolicyDecision:
        return self.for_principal(principal).decide(spec)

    def forget(self) -> None:
        """Drop the cache: the next decision reads the stored rules again."""
        with self._lock:
            self._cache.clear()


def as_book(policy: Policy | PolicyBook) -> PolicyBook:
    return policy if isinstance(policy, PolicyBook) else PolicyBook(policy)


__all__ = ["CACHED_PRINCIPALS", "PolicyBook", "as_book", "rule_of", "with_stored"]
