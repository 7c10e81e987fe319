"""Case 7: the simulator's throughput, crash points explored (crashes injected) per second
of wall time, from `lockgate simulate`'s own report."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Scenarios of every kind: a plain run, calls, approvals, a lease, a session.
SCENARIOS = ("plain", "several_calls", "approval_accepted", "lease_takeover", "session_idle")


def simulator_throughput(*, smoke: bool) -> dict[str, object]:
    scenarios = SCENARIOS[:1] if smoke else SCENARIOS
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "lockgate.server.cli", "simulate", "--report", str(report)]
        for scenario in scenarios:
            command += ["--scenario", scenario]
        started = time.monotonic()
        subprocess.run(command, capture_output=True, check=True, timeout=1800)
        seconds = time.monotonic() - started
        data = json.loads(report.read_text())
    crashes, runs = int(data["crashes"]), int(data["runs"])
    return {
        "scenarios": list(scenarios),
        "runs": runs,
        "crashes": crashes,
        "violations": len(data["violations"]),
        "seconds": round(seconds, 2),
        "crashes_per_second": round(crashes / seconds, 2),
        "runs_per_second": round(runs / seconds, 2),
    }
