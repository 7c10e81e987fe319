"""The official MCP conformance suite (npm `@modelcontextprotocol/conformance`, pinned)
against a real `lockgate serve` on SQLite: every server scenario of both protocol eras, the
suite's fixture tools served as a Python source exposed directly. It may fail only what the
committed baseline lists, each entry with its reason; a new failure, or a baseline entry
that passes, fails this test (the suite's own `--expected-failures`)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.conformance_suite import ROOT, SOURCES, run_suite
from tests.support.key_proxy import key_proxy
from tests.support.server_deployment import make_deployment


def _failed_checks(output: Path) -> list[str]:
    """Each failed check of the run, as scenario: check: message."""
    failed = []
    for checks in sorted(output.glob("*/checks.json")):
        for check in json.loads(checks.read_text()):
            if check.get("status") == "FAILURE":
                scenario = checks.parent.name.removeprefix("server-")[:-25]
                failed.append(f"{scenario}: {check.get('id')}: {check.get('errorMessage')}")
    return failed


def test_the_official_suite_passes_but_for_its_reasoned_baseline(tmp_path: Path) -> None:
    deployment = make_deployment(f"sqlite:///{tmp_path / 'lockgate.db'}", tmp_path)
    sources = tmp_path / "sources.toml"
    sources.write_text(SOURCES)
    try:
        server = deployment.start(
            name="conformance",
            LOCKGATE_SOURCES_FILE=str(sources),
            # The fixture source is a module of the tests.
            PYTHONPATH=str(ROOT),
        )
        [key] = server.printed_keys()
        with key_proxy(server.base_url, key) as proxy:
            done = run_suite(f"{proxy}/mcp", tmp_path / "results")
    finally:
        deployment.stop_all()
    failed = "\n".join(_failed_checks(tmp_path / "results"))
    assert done.returncode == 0, (
        f"the suite's verdict (exit {done.returncode}):\n"
        f"{done.stdout[done.stdout.find('=== SUMMARY'):]}\n{done.stderr[-3000:]}\n"
        f"failed checks:\n{failed}"
    )
