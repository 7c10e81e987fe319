"""Case 9: a real published API as a source: GitHub's REST description (npm `@octokit/openapi`,
13 MB of JSON, 1,223 operations), as an operator's `[[openapi]]` source.

- **Start-up**: `lockgate serve` spawned until `/readyz` answers, on a fresh SQLite file each
  time, three ways alternating: with no sources file (the floor: what a server costs without
  the API), with GitHub's description and an empty catalogue folder (cold: the document read
  and every operation's schema checked), and again with the catalogue the cold start kept
  (warm: a restart). Goals: cold ≤ 10 s, warm ≤ 3 s.
- **Memory**: each server's resident memory (`VmRSS`) once ready. Goal: with GitHub loaded,
  at most twice the floor's plus the catalogue's own size (its file).
- **Parsing, in process**: `json.loads` of the document (the parser's floor) against reading
  and building the source cold, and building it from its catalogue.
- **Finding a tool**: plain-English questions (`tests/support/published.py`'s
  `GITHUB_QUESTIONS`) asked of `describe_tools`' ranking; goal: the operation meant is in
  the top five for at least 90% of them.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path

from bench.resume import rss_mib
from bench.servers import lockgate_env, lockgate_serve
from lockgate.machine.tools.http_calls import HttpLimits
from lockgate.machine.tools.registry import ToolRegistry
from lockgate.machine.tools.source_file import load_sources
from tests.support.published import GITHUB_QUESTIONS, github_rest_description

SIDES = ("no_sources", "github_cold", "github_warm")


def _start(side: str, workdir: Path, run: int) -> tuple[float, float]:
    """One start of `side`: seconds to ready and MiB resident then."""
    folder = workdir / f"{side}-{run}"
    folder.mkdir()
    catalogues = workdir / "catalogues"
    settings = {"LOCKGATE_CATALOGUE_DIR": str(catalogues)}
    if side != "no_sources":
        settings["LOCKGATE_SOURCES_FILE"] = str(workdir / "sources.toml")
    if side == "github_cold":
        shutil.rmtree(catalogues, ignore_errors=True)
    env = lockgate_env(f"sqlite:///{folder / 'lockgate.db'}", folder, **settings)
    server = lockgate_serve(env, folder / "server.log")
    try:
        return server.ready_seconds, rss_mib(server.pid)
    finally:
        server.stop()


def _in_process(document: Path, catalogues: Path) -> dict[str, float]:
    began = time.perf_counter()
    json.loads(document.read_bytes())
    parsed = time.perf_counter() - began
    sources = document.parent / "sources.toml"
    shutil.rmtree(catalogues, ignore_errors=True)
    limits = HttpLimits(catalogues=catalogues)
    began = time.perf_counter()
    load_sources(sources, limits)
    cold = time.perf_counter() - began
    began = time.perf_counter()
    load_sources(sources, limits)
    warm = time.perf_counter() - began
    return {"json_loads_s": parsed, "build_cold_s": cold, "build_warm_s": warm}


def _found(sources: Path) -> dict[str, object]:
    registry = ToolRegistry()
    for source in load_sources(sources, HttpLimits()):
        registry.register(source)
    missed = {}
    for question, meant in GITHUB_QUESTIONS.items():
        top5 = [spec.name for spec in registry.describe(question)[:5]]
        if meant not in top5:
            missed[question] = {"meant": meant, "top5": top5}
    asked = len(GITHUB_QUESTIONS)
    return {"asked": asked, "found": asked - len(missed), "missed": missed}


def published_source_cost(workdir: Path, *, smoke: bool) -> dict[str, object]:
    document = workdir / "github.json"
    shutil.copy(github_rest_description(), document)
    (workdir / "sources.toml").write_text(
        '[[openapi]]\nname = "github"\ndocument = "github.json"\n'
        'base_url = "https://api.github.com"\n'
    )
    reps = 1 if smoke else 5
    starts: dict[str, list[tuple[float, float]]] = {side: [] for side in SIDES}
    for run in range(reps):
        for side in SIDES:  # alternating, so a drift of the machine touches every side
            starts[side].append(_start(side, workdir, run))
    catalogue_files = list((workdir / "catalogues").glob("*.json"))
    results: dict[str, object] = {
        "reps": reps,
        "document_bytes": document.stat().st_size,
        "catalogue_bytes": sum(f.stat().st_size for f in catalogue_files),
        "starts": {
            side: {
                "ready_s": statistics.median(s for s, _ in found),
                "rss_mib": statistics.median(r for _, r in found),
            }
            for side, found in starts.items()
        },
        "in_process": _in_process(document, workdir / "catalogues-in-process"),
        "finding": _found(workdir / "sources.toml"),
    }
    return results


def published_section(found: dict[str, object] | None) -> list[str]:
    """Section 9 of RESULTS.md."""
    if not found:
        return []
    starts: dict[str, dict[str, float]] = found["starts"]  # type: ignore[assignment]
    in_process: dict[str, float] = found["in_process"]  # type: ignore[assignment]
    finding: dict[str, object] = found["finding"]  # type: ignore[assignment]
    floor, cold, warm = (starts[side] for side in SIDES)
    catalogue_mib = int(found["catalogue_bytes"]) / 2**20  # type: ignore[call-overload]
    rss_goal = 2 * floor["rss_mib"] + catalogue_mib
    asked, hits = int(finding["asked"]), int(finding["found"])  # type: ignore[call-overload]
    missed: dict[str, dict[str, object]] = finding["missed"]  # type: ignore[assignment]
    document_mib = int(found["document_bytes"]) / 2**20  # type: ignore[call-overload]
    rows = [
        ("no sources file (the floor)", floor),
        ("GitHub's description, nothing kept (cold)", cold),
        ("GitHub's description again, its catalogue kept (a restart)", warm),
    ]
    return [
        "## 9. A published API as a source: GitHub's REST description",
        "",
        f"npm `@octokit/openapi`'s api.github.com.json ({document_mib:.1f} MiB, 1,223 "
        f"operations) as an operator's `[[openapi]]` source; `lockgate serve` until `/readyz` "
        f"answers, each side {found['reps']} times, alternating (medians).",
        "",
        "| start | ready | RSS once ready |",
        "|---|---|---|",
        *[
            f"| {label} | {side['ready_s']:.2f} s | {side['rss_mib']:.0f} MiB |"
            for label, side in rows
        ],
        "",
        f"- Cold start {cold['ready_s']:.1f} s (goal ≤ 10 s), a restart {warm['ready_s']:.1f} s "
        f"(goal ≤ 3 s); {warm['ready_s'] - floor['ready_s']:+.2f} s over the floor.",
        f"- RSS with GitHub loaded: {cold['rss_mib']:.0f} MiB cold, {warm['rss_mib']:.0f} MiB "
        f"warm; goal ≤ {rss_goal:.0f} MiB (twice the floor's {floor['rss_mib']:.0f} MiB plus "
        f"the catalogue's {catalogue_mib:.1f} MiB).",
        f"- In process: `json.loads` of the document {in_process['json_loads_s']:.2f} s (the "
        f"parser's floor); read and build cold {in_process['build_cold_s']:.2f} s (the rest is "
        f"checking each operation's schema); from the catalogue "
        f"{in_process['build_warm_s']:.2f} s.",
        f"- Finding a tool: the operation meant is in `describe_tools`' top five for "
        f"**{hits} of {asked}** plain-English questions ({100 * hits / asked:.0f}%; goal ≥ 90%)."
        + (
            " Missed: " + "; ".join(f'"{q}" ({m["meant"]})' for q, m in missed.items()) + "."
            if missed
            else ""
        ),
        "",
    ]
