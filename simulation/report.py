"""What a simulation run prints and writes: counts, the coverage matrix, violations."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from lockgate.simulation.invariants import INVARIANTS
from lockgate.simulation.sweep import DRIVEN_MACHINES, RunResult, SweepReport
from lockgate.spec import MACHINES, CrashPoint, every_crash_point


def _abbreviate(names: Iterable[str], width: int = 60) -> str:
    text = ", ".join(sorted(names))
    return text if len(text) <= width else text[: width - 1] + "…"


def coverage_matrix(report: SweepReport, machines: Iterable[str] = DRIVEN_MACHINES) -> str:
    """transition x crash point -> scenarios that reached it, and violations seen there."""
    violations_at: dict[CrashPoint, int] = {}
    for run in report.violations:
        for point in run.plan:
            violations_at[point] = violations_at.get(point, 0) + 1
    lines = []
    for machine in machines:
        lines.append(f"{machine}:")
        for point in every_crash_point(MACHINES[machine]):
            scenarios = report.coverage.get(point, set())
            mark = "  " if scenarios else "!!"
            transition = f"{point.event} {point.source}->{point.dest}"
            lines.append(
                f" {mark} {transition:<52} {point.phase:<13} {len(scenarios):>2} scenarios"
                f"  {violations_at.get(point, 0)} violations  {_abbreviate(scenarios)}"
            )
    return "\n".join(lines)


def summary(report: SweepReport, scenarios: int, mode: str) -> str:
    unreached = report.unreached()
    total = sum(len(every_crash_point(MACHINES[m])) for m in DRIVEN_MACHINES)
    return (
        f"simulation ({mode}): {scenarios} scenarios, {len(report.runs)} runs, "
        f"{report.crashes_fired()} crashes injected, "
        f"{total - len(unreached)}/{total} crash points reached, "
        f"{len(INVARIANTS)} invariants checked, violations = {len(report.violations)}"
    )


def describe_violation(run: RunResult, seed: int | None) -> str:
    lines = [f"VIOLATION in scenario {run.scenario!r}"]
    if seed is not None:
        lines.append(f"  seed: {seed}")
    lines.append(f"  crash points: {', '.join(p.name for p in run.plan) or '(none)'}")
    for v in run.violations:
        lines.append(f"  [{v.invariant}] {v.detail}")
    lines.append("  trace:")
    lines += [f"    {i + 1}. {step}" for i, step in enumerate(run.trace)]
    lines.append(f"  reproduce: {run.reproduce()}")
    return "\n".join(lines)


def write_json(report: SweepReport, path: Path, *, mode: str, seed: int | None) -> None:
    data = {
        "mode": mode,
        "seed": seed,
        "runs": len(report.runs),
        "crashes": report.crashes_fired(),
        "violations": [
            {
                "scenario": r.scenario,
                "crash_points": [p.name for p in r.plan],
                "violations": [
                    {"invariant": v.invariant, "detail": v.detail} for v in r.violations
                ],
                "trace": r.trace,
                "reproduce": r.reproduce(),
            }
            for r in report.violations
        ],
        "coverage": {
            p.name: sorted(report.coverage.get(p, set()))
            for m in DRIVEN_MACHINES
            for p in every_crash_point(MACHINES[m])
        },
        "unreached": [p.name for p in report.unreached()],
        "invariants": list(INVARIANTS),
    }
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
