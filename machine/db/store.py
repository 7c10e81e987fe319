"""The SQL store: the write path's transaction, on SQLite or PostgreSQL.

Each `commit` is ONE transaction. Every change becomes

    UPDATE <table> SET status = :dest, version = version + 1, ...
    WHERE id = :id AND version = :expected AND status = :source

with (source, dest) checked against the spec first, and a change that touches no row turns
the whole transaction into a `Conflict`. New rows may be inserted in the same transaction,
and only in their lifecycle's initial state; a change of a row inserted in the same
transaction is made on the values inserted instead (nobody else can see the row in between;
the same version and status check, on those values), and logged as any other. Writes outside
the lifecycles that must commit with the transition or not at all (`StoreWrite`, e.g.
removing an approver in the commit that signs them out) run in it too.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import cache
from typing import Any, Protocol

from sqlalchemy import Connection, Engine, Insert, Table, Update, bindparam, insert, update
from sqlmodel import Session, SQLModel

from lockgate.machine.db.audit_export_queries import AuditExportQueries
from lockgate.machine.db.connect import lazy_commits, sqlite_file
from lockgate.machine.db.driver_statements import for_driver
from lockgate.machine.db.execution_queries import ExecutionQueries
from lockgate.machine.db.group_commit import Committer, GroupCommit, SoloCommit
from lockgate.machine.db.inbox_queries import InboxQueries
from lockgate.machine.db.instance_queries import InstanceQueries
from lockgate.machine.db.key_queries import KeyQueries
from lockgate.machine.db.metrics_queries import MetricsQueries
from lockgate.machine.db.people_queries import ApproverQueries, SignInQueries
from lockgate.machine.db.policy_queries import PolicyQueries
from lockgate.machine.db.schema import (
    ApproverSession,
    Enrolment,
    Execution,
    Instance,
    OwedRequest,
    ToolCall,
    TransitionLog,
    WebhookDelivery,
    metadata,
)
from lockgate.machine.db.schema import Session as SessionRow
from lockgate.machine.db.secret_queries import SecretQueries
from lockgate.machine.db.session_queries import SessionQueries
from lockgate.machine.db.source_queries import SourceQueries
from lockgate.machine.db.storage_queries import Grow, StorageQueries
from lockgate.machine.db.tool_call_queries import ToolCallQueries
from lockgate.machine.db.webhook_queries import WebhookQueries
from lockgate.machine.errors import Conflict, IllegalTransition
from lockgate.machine.records import Change, Fence
from lockgate.machine.store import declared_edges, refuse_undeclared
from lockgate.spec import MACHINES, MachineSpec

#: Which table holds each lifecycle.
TABLES: Mapping[str, type[SQLModel]] = {
    "execution": Execution,
    "tool_call": ToolCall,
    "session": SessionRow,
    "owed_request": OwedRequest,
    "instance": Instance,
    "webhook_delivery": WebhookDelivery,
    "approver_session": ApproverSession,
    "enrolment": Enrolment,
}
MACHINE_OF: Mapping[type[SQLModel], str] = {model: name for name, model in TABLES.items()}
#: Rows are inserted parents first, as the ORM's unit of work would order them.
_INSERT_ORDER = {table.name: n for n, table in enumerate(metadata.sorted_tables)}


def _table(model: type[SQLModel]) -> Table:
    table = model.__table__  # type: ignore[attr-defined]
    assert isinstance(table, Table)
    return table


_LOG = _table(TransitionLog)


# The statements of the commit path are built once, with bound parameters, and reused: a
# statement object compiles once and SQLAlchemy memoizes its cache key, so a commit pays
# neither again. The commit path is Core, not the ORM: its unit of work cost three times
# as much CPU per commit as the statements themselves.
@cache
def _transition(table_name: str, columns: tuple[str, ...]) -> Update:
    """Move one row of `table_name` from `:w_status`/`:w_version`, setting `columns`."""
    table = metadata.tables[table_name]
    return (
        update(table)
        .where(
            table.c.id == bindparam("w_id"),
            table.c.version == bindparam("w_version"),
            table.c.status == bindparam("w_status"),
        )
        .values({name: bindparam(f"v_{name}", type_=table.c[name].type) for name in columns})
    )


@cache
def _fence(table_name: str) -> Update:
    """A no-op update: it matches only the fenced version, and on PostgreSQL it locks the
    row, so a concurrent writer of that record waits or conflicts."""
    table = metadata.tables[table_name]
    return (
        update(table)
        .where(table.c.id == bindparam("w_id"), table.c.version == bindparam("w_version"))
        .values(version=table.c.version)
    )


@cache
def _fence_growing() -> Update:
    """The fence of an execution that also adds `:w_bytes` to the bytes it keeps: the
    transaction's `Grow` for the fenced execution rides on the fence's update instead of an
    update of its own (3 of an approved write's 4 commits fence an execution that grows)."""
    table = _table(Execution)
    return (
        update(table)
        .where(table.c.id == bindparam("w_id"), table.c.version == bindparam("w_version"))
        .values(stored_bytes=table.c.stored_bytes + bindparam("w_bytes"))
    )


def _fold_growth(
    fences: Sequence[Fence], writes: Sequence[StoreWrite]
) -> tuple[list[int], list[StoreWrite]]:
    """The bytes each fence adds to its execution in this transaction (in the fences'
    order; 0 for a fence of another record, or of an execution fenced twice), and the
    writes left once those are taken out of the `Grow`s."""
    growth = {f.record_id: 0 for f in fences if f.machine == "execution"}
    if not growth:
        return [0] * len(fences), list(writes)
    rest: list[StoreWrite] = []
    for extra in writes:
        if not isinstance(extra, Grow):
            rest.append(extra)
            continue
        others = []
        for execution_id, added in extra.by_execution:
            if execution_id in growth:
                growth[execution_id] += added
            else:
                others.append((execution_id, added))
        if others:
            rest.append(Grow(tuple(others)))
    added_by = [growth.pop(f.record_id, 0) if f.machine == "execution" else 0 for f in fences]
    return added_by, rest


@cache
def _insert(table_name: str) -> Insert:
    return insert(metadata.tables[table_name])


def _row_values(table: Table, row: SQLModel) -> dict[str, Any]:
    """The row's column values; an unset generated key is left to the database."""
    values = {c.name: getattr(row, c.name) for c in table.columns}
    for key in table.primary_key.columns:
        if values.get(key.name) is None:
            values.pop(key.name, None)
    return values


def _fold_changes(
    rows: Sequence[tuple[Table, SQLModel]], changes: Sequence[Change], now: datetime
) -> tuple[list[tuple[str, list[dict[str, Any]]]], list[Change]]:
    """The commit's inserts as batches (one statement per table and set of columns, in
    insert order), with the changes of rows inserted in this same commit applied to the
    values inserted; and the changes left to update stored rows.

    A row inserted and moved on in one transaction is inserted as the move leaves it: no
    other transaction can see it in between, so the version check its update would make
    has nothing to check (it is made here, on the values). Every change is still logged.
    A journaled read is inserted and settled in the commit that carries it: its update
    cost as much as its insert."""
    inserted: dict[tuple[str, object], tuple[Table, dict[str, Any]]] = {}
    values = []
    for table, row in rows:
        row_values = _row_values(table, row)
        values.append((table, row_values))
        machine = MACHINE_OF.get(type(row))
        if machine is not None:
            inserted[(machine, row_values.get("id"))] = (table, row_values)
    updated = []
    for change in changes:
        found = inserted.get((change.machine, change.record_id))
        if found is None:
            updated.append(change)
            continue
        table, row_values = found
        if (row_values["version"], row_values["status"]) != (
            change.expected_version,
            change.source,
        ):
            raise Conflict(
                machine=change.machine,
                record_id=change.record_id,
                expected_version=change.expected_version,
            )
        row_values.update(change.updates)
        row_values.update(status=change.dest, version=change.expected_version + 1)
        if "updated_at" in table.c and "updated_at" not in change.updates:
            row_values["updated_at"] = now
    batches: list[tuple[str, list[dict[str, Any]]]] = []
    for table, row_values in values:
        last = batches[-1] if batches else None
        if last is not None and last[0] == table.name and last[1][0].keys() == row_values.keys():
            last[1].append(row_values)
        else:
            batches.append((table.name, [row_values]))
    return batches, updated


def _send(conn: Connection, statement: Insert | Update, values: Mapping[str, object]) -> int:
    """Run one of the commit path's statements; the rows it changed."""
    sent = for_driver(conn, statement, tuple(values))
    if sent is not None:
        return sent.run(conn, values)
    return conn.execute(statement, values).rowcount


def _send_many(conn: Connection, statement: Insert, rows: Sequence[Mapping[str, object]]) -> None:
    """Run an insert of the commit path for each of `rows` (all with the same keys)."""
    sent = for_driver(conn, statement, tuple(rows[0]))
    if sent is not None:
        sent.run_many(conn, rows)
    else:
        conn.execute(statement, list(rows))


class StoreWrite(Protocol):
    """A write outside the lifecycles, committed in a transition's transaction: both commit
    or neither does. It refuses by raising, which rolls the whole transaction back."""

    def write(self, conn: Connection) -> None: ...


class SqlStore:
    def __init__(self, engine: Engine, specs: Mapping[str, MachineSpec] | None = None) -> None:
        self.engine = engine
        self.specs = MACHINES if specs is None else specs
        self._edges = declared_edges(self.specs)
        lazy = lazy_commits(engine)  # for commits that do not wait for the disk
        database = sqlite_file(str(engine.url)) if engine.dialect.name == "sqlite" else None
        grouped = (
            GroupCommit(engine, database.with_name(database.name + "-writer"))
            if database is not None
            else None
        )
        #: How commits reach the database: grouped on a SQLite file (`GroupCommit`).
        self.committer: Committer = grouped or SoloCommit(engine, lazy)
        # The few writes outside the lifecycles take the same writer lock.
        writer = grouped.writer if grouped is not None else None
        # The typed reads, by domain: callers ask these, never build SQL of their own.
        self.sessions = SessionQueries(engine)
        self.instances = InstanceQueries(engine)
        self.executions = ExecutionQueries(engine)
        self.keys = KeyQueries(engine, writer)
        self.metrics = MetricsQueries(engine)
        self.policies = PolicyQueries(engine, writer)
        self.secrets = SecretQueries(engine, writer)
        self.sources = SourceQueries(engine, writer)
        self.audit_export = AuditExportQueries(engine)
        self.inbox = InboxQueries(engine)
        self.tool_calls = ToolCallQueries(engine)
        self.webhooks = WebhookQueries(engine)
        self.approvers = ApproverQueries(engine, writer)
        self.sign_ins = SignInQueries(engine, writer)
        self.storage = StorageQueries(engine, writer)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A read session (or a transaction of one's own for writes outside lifecycles)."""
        with Session(self.engine, expire_on_commit=False) as session:
            yield session

    def commit(
        self,
        changes: Sequence[Change],
        inserts: Sequence[SQLModel] = (),
        fences: Sequence[Fence] = (),
        writes: Sequence[StoreWrite] = (),
        *,
        wait_for_disk: bool = True,
    ) -> None:
        now = datetime.now(UTC)
        txn = uuid.uuid4().hex
        fenced_by = ",".join(f"{f.machine}:{f.record_id}:{f.version}" for f in fences) or None
        for row in inserts:
            self._refuse_non_initial(row)
        for change in changes:
            refuse_undeclared(change, self._edges)
        rows = sorted(
            ((_table(type(row)), row) for row in inserts),
            key=lambda pair: _INSERT_ORDER[pair[0].name],
        )
        batches, updated = _fold_changes(rows, changes, now)
        growth, writes = _fold_growth(fences, writes)

        def statements(conn: Connection) -> None:
            for fence, added in zip(fences, growth, strict=True):
                params: dict[str, object] = {"w_id": fence.record_id, "w_version": fence.version}
                if fence.machine == "execution":
                    held = _send(conn, _fence_growing(), {**params, "w_bytes": added})
                else:
                    held = _send(conn, _fence(_table(TABLES[fence.machine]).name), params)
                if held != 1:
                    raise Conflict(
                        machine=fence.machine,
                        record_id=fence.record_id,
                        expected_version=fence.version,
                    )
            # Before the transitions: a one-time write that refuses (raises) refuses the
            # whole transaction before anything else in it is written.
            for extra in writes:
                extra.write(conn)
            for table_name, batch in batches:
                _send_many(conn, _insert(table_name), batch)
            for change in updated:
                table = _table(TABLES[change.machine])
                values: dict[str, object] = dict(change.updates)
                values.update(status=change.dest, version=change.expected_version + 1)
                if "updated_at" in table.c:
                    values.setdefault("updated_at", now)
                moved = _send(
                    conn,
                    _transition(table.name, tuple(sorted(values))),
                    {
                        "w_id": change.record_id,
                        "w_version": change.expected_version,
                        "w_status": change.source,
                        **{f"v_{name}": value for name, value in values.items()},
                    },
                )
                if moved != 1:
                    # Raising rolls every change of this commit back.
                    raise Conflict(
                        machine=change.machine,
                        record_id=change.record_id,
                        expected_version=change.expected_version,
                    )
            if changes:
                _send_many(
                    conn,
                    _insert(_LOG.name),
                    [
                        {
                            "machine": change.machine,
                            "record_id": change.record_id,
                            "event": change.event,
                            "source": change.source,
                            "dest": change.dest,
                            "version": change.expected_version + 1,
                            "at": now,
                            "txn": txn,
                            "fence": fenced_by,
                        }
                        for change in changes
                    ],
                )

        self.committer.commit(statements, wait_for_disk=wait_for_disk)

    def _refuse_non_initial(self, row: SQLModel) -> None:
        machine = MACHINE_OF.get(type(row))
        if machine is None:
            return
        status = getattr(row, "status", None)
        initial = self.specs[machine].initial.name
        if status != initial:
            raise IllegalTransition(
                machine=machine,
                record_id=str(getattr(row, "id", "?")),
                event="insert",
                source="(new)",
                dest=str(status),
            )
