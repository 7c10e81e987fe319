"""One commit through the SQL store, in a process of its own, for a test to watch from the
outside (its fsyncs under strace, or its survival of a SIGKILL).

    python -m tests.support.procs.one_commit DATABASE_URL {wait|lazy} {exit|kill}

The database must be migrated. A warm-up commit opens the file and the log first; the
measured commit (an instance row, committed waiting for the disk or not) is made between two
`stat`s of paths that do not exist (`bench.counting`'s markers). `kill` then SIGKILLs the
process at once, as a crash right after the commit returned would.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from datetime import UTC, datetime

from bench.counting import BEGIN, END
from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.schema import Instance
from lockgate.machine.db.store import SqlStore


def instance_row(name: str) -> Instance:
    now = datetime.now(UTC)
    return Instance(
        id=uuid.uuid4().hex,
        name=name,
        incarnation=uuid.uuid4().int % 2**31,
        status="live",
        host="test",
        pid=os.getpid(),
        started_at=now,
        lease_until=now,
    )


def main(url: str, mode: str, end: str) -> None:
    store = SqlStore(open_engine(url))
    store.commit((), (instance_row("warm-up"),))
    os.path.exists(BEGIN)
    store.commit((), (instance_row("measured"),), wait_for_disk=mode == "wait")
    os.path.exists(END)
    if end == "kill":
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(*sys.argv[1:4])
