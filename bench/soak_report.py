"""The soak's figures kept for RESULTS.md: `python -m bench.soak --record LABEL` adds a run
to `bench/soaks.json`, and the report renders every recorded run side by side."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOAKS = HERE / "soaks.json"


def load() -> dict[str, Any]:
    return json.loads(SOAKS.read_text()) if SOAKS.exists() else {}


def record(label: str, command: str, figures: dict[str, int], seconds: float) -> None:
    """Keep this run's figures under `label` (replacing an earlier run of that label)."""
    soaks = load()
    soaks[label] = {
        "command": command,
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "seconds": round(seconds),
        "figures": figures,
    }
    SOAKS.write_text(json.dumps(soaks, indent=1) + "\n")


def soak_section(soaks: dict[str, Any]) -> list[str]:
    if not soaks:
        return []
    labels = list(soaks)
    lines = [
        "## The soak under kills",
        "",
        "`python -m bench.soak` (`make soak`): clients doing a mix of everything while "
        "instances are SIGKILLed and restarted; the checker's figures (hung, duplicated, "
        "consumed twice, stranded and secrets must be 0).",
        "",
    ]
    for label in labels:
        run = soaks[label]
        lines.append(
            f"- **{label}**: `{run['command']}`, {run['seconds']} s in all on {run['cores']} "
            f"cores, {run['when']}."
        )
    lines += ["", "| figure | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    names = list(soaks[labels[0]]["figures"])
    for name in names:
        values = [str(soaks[label]["figures"].get(name, "")) for label in labels]
        lines.append(f"| {name} | " + " | ".join(values) + " |")
    return [*lines, ""]
