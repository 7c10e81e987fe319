"""Approval links: credentials outside the lifecycles, each deciding one call once.

A link row is read by id (primary key) or by the name it is handed out as (the unique index
on `link`); using one up is a `StoreWrite` committed in the transaction of the decision it
carries, so a crash before that commit leaves the link usable. Nothing here opens a link:
the signed link itself is the credential (`server.approval_tokens`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, delete, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from lockgate.machine.db.queries import Queries
from lockgate.machine.db.schema import ApprovalToken
from lockgate.machine.errors import ErrorCode, LockgateError


class ApprovalTokenUsed(LockgateError):
    """The approval token was used already: the decision it was to carry is not taken."""

    code = ErrorCode.FORBIDDEN

    def __init__(self) -> None:
        super().__init__(
            "This approval link was already used: a decision was already sent with it, and "
            "each link decides once.",
            hint="Fetch the execution (with an API key) to see the decision and its outcome.",
        )


@dataclass(frozen=True)
class UseApprovalToken:
    """Use an approval token up, in the transaction of the decision it carries: a crash
    before that commits leaves the link usable, and of two uses only one commits (the
    condition `used_at IS NULL`; the other's whole transaction is refused)."""

    link_id: str
    at: datetime

    def write(self, conn: Connection) -> None:
        result = conn.execute(
            update(ApprovalToken)
            .where(
                col(ApprovalToken.id) == self.link_id,
                col(ApprovalToken.used_at).is_(None),
            )
            .values(used_at=self.at)
        )
        if result.rowcount != 1:
            raise ApprovalTokenUsed()


class ApprovalTokenQueries(Queries):
    def get(self, link_id: str) -> ApprovalToken | None:
        """The link row by id (primary key): the id a signed link names."""
        with self._session() as s:
            return s.get(ApprovalToken, link_id)

    def by_link(self, link: str) -> ApprovalToken | None:
        """The link row currently handed out as `link` (see `ApprovalToken.link`)."""
        with self._session() as s:
            return s.exec(select(ApprovalToken).where(ApprovalToken.link == link)).first()

    def add(self, row: ApprovalToken) -> None:
        """Store a new link row in a transaction of its own (a link not handed out by name)."""
        with self._writing() as s:
            s.add(row)

    def hand_out(self, row: ApprovalToken, *, retire: str | None = None) -> ApprovalToken:
        """Make `row` the one handed out as its `link`, first retiring the row `retire` (by
        id) from it, in one transaction. If another writer handed a row out as that link
        first, its row is returned instead: the link is unique, so two answers shown at once
        still give one link."""
        assert row.link is not None
        for _ in range(3):
            try:
                with self._writing() as s:
                    if retire is not None:
                        s.execute(
                            update(ApprovalToken)
                            .where(
                                col(ApprovalToken.id) == retire,
                                col(ApprovalToken.link) == row.link,
                            )
                            .values(link=None)
                        )
                    s.add(row)
                return row
            except IntegrityError:
                # Lost the race: the winner's committed row is the link. Had it been retired
                # in between by yet another writer, try again.
                won = self.by_link(row.link)
                if won is not None:
                    return won
        raise RuntimeError(f"approval link {row.link!r} kept changing while being handed out")

    def purge(self, older_than: datetime) -> int:
        """Delete links that expired before `older_than`; returns how many."""
        with self._writing() as s:
            result = s.execute(
                delete(ApprovalToken).where(col(ApprovalToken.expires_at) < older_than)
            )
        return int(result.rowcount)  # type: ignore[attr-defined]
