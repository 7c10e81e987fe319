"""The official MCP conformance suite (npm `@modelcontextprotocol/conformance`, pinned)
against a real `lockgate serve` on SQLite: every server scenario of both protocol eras, the
suite's fixture tools served as a Python source exposed directly. It may fail only what the
committed baseline lists, each entry with its reason; a new failure, or a baseline entry
that passes, fails this test (the suite's own `--expected-failures`). One of its tasks
scenarios also runs while the server is SIGKILLed and restarted in the middle of it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.conformance_suite import ROOT, SOURCES, run_suite
from tests.support.key_proxy import key_proxy
from tests.support.lockgate_server import LockgateServer
from tests.support.server_deployment import make_deployment


def _checks(output: Path) -> dict[str, str]:
    """Each check of the run by id, and its status."""
    return {
        str(check["id"]): str(check["status"])
        for checks in sorted(output.glob("*/checks.json"))
        for check in json.loads(checks.read_text())
    }


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


def test_a_tasks_scenario_passes_while_the_server_is_sigkilled_in_its_middle(
    tmp_path: Path,
) -> None:
    """tasks-mrtr-input: confirm_delete's task is created by one process, which is killed
    before the suite's first tasks/get; the restarted one serves the rest of the scenario."""
    deployment = make_deployment(f"sqlite:///{tmp_path / 'lockgate.db'}", tmp_path)
    sources = tmp_path / "sources.toml"
    sources.write_text(SOURCES)
    settings = {"LOCKGATE_SOURCES_FILE": str(sources), "PYTHONPATH": str(ROOT)}
    restarted: list[LockgateServer] = []
    try:
        server = deployment.start(name="before", **settings)
        [key] = server.printed_keys()

        def kill_before_the_first_poll(body: bytes) -> None:
            if not restarted and b'"tasks/get"' in body:
                server.kill()
                restarted.append(deployment.start_at(server.port, name="after", **settings))

        with key_proxy(server.base_url, key, kill_before_the_first_poll) as proxy:
            done = run_suite(f"{proxy}/mcp", tmp_path / "results", scenario="tasks-mrtr-input")
    finally:
        deployment.stop_all()
    assert restarted, "the suite never polled a task"
    checks = _checks(tmp_path / "results")
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{_failed_checks(tmp_path / 'results')}"
    # The checks that ran across the kill: the task made before it is input_required after
    # it, and tasks/update on the new process resumes it to completed.
    assert checks["sep-2663-tasks-get-status-input-required"] == "SUCCESS", checks
    assert checks["tasks-mrtr-tasks-update-resumes"] == "SUCCESS", checks
