"""Stored tool-policy rules (for machine/policy_book.py and `lockgate policy`): reads, and
their own writes.

Rules are configuration, not lifecycle records: an add or a removal is a plain transaction
of its own here, not a `SqlStore.commit`.
"""

from __future__ import annotations

from sqlmodel import col, select

from lockgate.machine.db.queries import Queries, applies_to, same_value
from lockgate.machine.db.schema import PolicyRuleRow


class PolicyQueries(Queries):
    def add(self, row: PolicyRuleRow) -> PolicyRuleRow:
        """Store `row`, unless a rule for the same principal, pattern and condition is
        already stored: then that one is returned and nothing is written (two rules for one
        target would leave the reader to guess which was meant)."""
        with self._writing() as s:
            same = s.exec(
                select(PolicyRuleRow).where(
                    same_value(col(PolicyRuleRow.principal_id), row.principal_id),
                    PolicyRuleRow.pattern == row.pattern,
                    same_value(col(PolicyRuleRow.condition), row.condition),
                )
            ).first()
            if same is not None:
                return same
            s.add(row)
        return row

    def remove(self, rule_id: str) -> PolicyRuleRow | None:
        """Delete the rule; returns it as it was, or None when there is no such rule."""
        with self._writing() as s:
            row = s.get(PolicyRuleRow, rule_id)
            if row is not None:
                s.delete(row)
        return row

    def all(self) -> list[PolicyRuleRow]:
        """Every stored rule, global ones first, then by principal, oldest first."""
        with self._session() as s:
            return list(
                s.exec(
                    select(PolicyRuleRow).order_by(
                        col(PolicyRuleRow.principal_id).is_not(None),
                        col(PolicyRuleRow.principal_id),
                        col(PolicyRuleRow.created_at),
                    )
                )
            )

    def applying_to(self, principal_id: str | None) -> list[PolicyRuleRow]:
        """The global rules and `principal_id`'s own (for None: the global ones only; index
        on `principal_id`)."""
        with self._session() as s:
            return list(
                s.exec(
                    select(PolicyRuleRow)
                    .where(applies_to(col(PolicyRuleRow.principal_id), principal_id))
                    .order_by(col(PolicyRuleRow.created_at))
                )
            )
