"""The harness's reference model: the spec itself, replayed over the transition log.

After every action the new rows of the log are replayed through the spec: each must be a
declared edge leaving the state its record was last in (or its lifecycle's initial state),
and the replayed state of every record must equal its stored status. The replay also counts
which events happened, so a test can tell whether a driver made its event happen.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from sqlalchemy import Engine
from sqlalchemy import select as select_columns
from sqlmodel import Session, col, select

from lockgate.machine.db.schema import TransitionLog, metadata
from lockgate.spec import MachineSpec

#: The lifecycles the drivers cover: sessions and owed requests are driven as the HTTP
#: session gate drives them (the same `Sessions` methods, with a client's inbox).
DRIVEN_MACHINES = ("execution", "tool_call", "instance", "session", "owed_request")
#: The table holding each lifecycle's rows (for comparing stored statuses with the model).
TABLE_OF = {
    "execution": "executions",
    "tool_call": "tool_calls",
    "instance": "instances",
    "session": "sessions",
    "owed_request": "owed_requests",
}


class SpecReplay:
    """The state the spec says every record is in, from the log rows replayed so far."""

    def __init__(self, machines: Mapping[str, MachineSpec]) -> None:
        self.machines = machines
        #: (machine, record id) -> the state the spec replay says it is in.
        self.model: dict[tuple[str, str], str] = {}
        self.replay_errors: list[str] = []
        #: (machine, event) -> how many times the log showed it (coverage).
        self.observed: Counter[tuple[str, str]] = Counter()
        self._log_seen = 0
        self._edges = {
            name: {(t.event, s, d) for t in spec.transitions for s, d in t.edges()}
            for name, spec in machines.items()
        }

    def replay(self, engine: Engine) -> None:
        """Replay the transitions logged since the last call through the spec."""
        with Session(engine) as s:
            rows = list(
                s.exec(
                    select(TransitionLog)
                    .where(col(TransitionLog.id) > self._log_seen)
                    .order_by(col(TransitionLog.id))
                )
            )
        for row in rows:
            assert row.id is not None
            self._log_seen = row.id
            key = (row.machine, row.record_id)
            self.observed[(row.machine, row.event)] += 1
            spec = self.machines.get(row.machine)
            if spec is None:
                self.replay_errors.append(f"log row {row.id}: no lifecycle {row.machine!r}")
                continue
            edge = f"{row.machine} {row.record_id}: {row.event} {row.source}->{row.dest}"
            if (row.event, row.source, row.dest) not in self._edges[row.machine]:
                self.replay_errors.append(f"log row {row.id}: {edge} is not an edge of the spec")
            before = self.model.get(key, spec.initial.name)
            if row.source != before:
                self.replay_errors.append(
                    f"log row {row.id}: {edge} left {row.source!r} but the model has it "
                    f"in {before!r}"
                )
            self.model[key] = row.dest

    def disagreements(self, engine: Engine) -> list[str]:
        """Where the reference model and the database disagree (with every replay error)."""
        out = list(self.replay_errors)
        stored: set[tuple[str, str]] = set()
        with engine.connect() as conn:
            for machine, table_name in TABLE_OF.items():
                spec = self.machines.get(machine)
                if spec is None:
                    continue
                table = metadata.tables[table_name]
                for record_id, status in conn.execute(select_columns(table.c.id, table.c.status)):
                    key = (machine, str(record_id))
                    stored.add(key)
                    expected = self.model.get(key, spec.initial.name)
                    if status != expected:
                        out.append(
                            f"{machine} {record_id} is stored {status!r}; the spec replay says "
                            f"{expected!r}"
                        )
        out += [
            f"{m} {r} is in the log but not stored" for m, r in self.model if (m, r) not in stored
        ]
        return out
