"""Cases 1 and 2: one execution of N tool calls, timed on every side of one database,
alternating (each repetition runs every side once per N, in turn), in one process.

Run as `python -m bench.timing DATABASE_URL WORKDIR --ns 1,10,100 --reps 5`; it prints one
JSON object: per side and N, the wall seconds and this process's CPU seconds of each run.
The sandbox's worker process is not this process: its CPU is not in the figure (the same
worker serves `monty_in_memory`, so the difference between the two sides is the journal's).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.sides import BareCommits, DbosSide, LockgateSide, MontyInMemory, Side


def sides(database_url: str, workdir: Path, *, with_monty: bool) -> list[Side]:
    stem = "sqlite:///" + str(workdir) + "/{}.db"
    sqlite = database_url.startswith("sqlite")

    def url(name: str) -> str:
        # One file per side on SQLite (no side waits for another's write lock); one
        # database on PostgreSQL, which is what a server there would share.
        return stem.format(name) if sqlite else database_url

    made: list[Side] = [
        BareCommits(url("floor")),
        LockgateSide(url("lockgate"), workdir, kind="reads"),
        LockgateSide(url("lockgate"), workdir, kind="writes"),
        DbosSide(url("dbos")),
    ]
    if with_monty:
        made.append(MontyInMemory())
    return made


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("database_url")
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--ns", default="1,10,100")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--monty", action="store_true")
    args = parser.parse_args()
    ns = [int(n) for n in args.ns.split(",")]
    made = sides(args.database_url, args.workdir, with_monty=args.monty)
    samples: dict[str, dict[str, list[list[float]]]] = {s.name: {} for s in made}
    try:
        for side in made:  # warm: connections opened, statements cached, worker forked
            side.run(1)
        for _ in range(args.reps):
            for n in ns:
                for side in made:
                    cpu = time.process_time()
                    wall = side.run(n)
                    cpu = time.process_time() - cpu
                    samples[side.name].setdefault(str(n), []).append([wall, cpu])
    finally:
        for side in made:
            side.close()
    print(json.dumps(samples))


if __name__ == "__main__":
    main()
