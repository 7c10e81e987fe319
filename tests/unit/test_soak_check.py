"""The soak's checker finds what it exists to find: a clean run passes, and a hung request,
a write made twice, a stranded execution or a secret in a log each fail it by name."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.soak_check import check
from bench.soak_clients import ClientLog
from lockgate.machine.engine import Action
from lockgate.machine.runtime import Runtime
from tests.support.canary import CANARY

WRITE = 'tools.notes.write(key="k", text="v")'


def _clean_run(make_runtime: Callable[..., Runtime]) -> Runtime:
    runtime = make_runtime()
    paused = runtime.engine.execute("alice", WRITE)
    done = runtime.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert done.status == "completed"
    return runtime


def _log(**requests: int) -> ClientLog:
    log = ClientLog()
    log.requests.update({"sent": 2, "answered": 2, **requests})
    log.operations["k"] = ("approve", "completed")
    return log


def test_a_clean_run_passes(
    make_runtime: Callable[..., Runtime], database_url: str, tmp_path: Path
) -> None:
    _clean_run(make_runtime)
    figures = check(database_url, tmp_path / "notes", [_log()], [], [CANARY], kills=0)
    assert figures.failures == []
    assert figures.rows["approvals granted"] == figures.rows["approvals consumed once"] == 1
    assert figures.rows["writes made"] == 1


def test_each_broken_promise_fails_the_run_by_name(
    make_runtime: Callable[..., Runtime], database_url: str, tmp_path: Path
) -> None:
    runtime = _clean_run(make_runtime)
    # A write made twice, as the notes tool's own log would show it.
    effects = tmp_path / "notes" / "effects.jsonl"
    first = json.loads(effects.read_text().splitlines()[0])
    with effects.open("a") as f:
        f.write(json.dumps(first) + "\n")
    # An execution left queued with nobody to run it.
    runtime.engine.submit("alice", "1")
    leaked = tmp_path / "server.log"
    leaked.write_text(f"token={CANARY}\n")
    figures = check(database_url, tmp_path / "notes", [_log(hung=1)], [leaked], [CANARY], kills=1)
    assert set(figures.failures) == {"hung", "effects duplicated", "stranded", "secrets"}
    table: Any = figures.table()
    assert "| effects duplicated | 1 |" in table and "| hung | 1 |" in table
