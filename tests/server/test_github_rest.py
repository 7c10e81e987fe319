"""GitHub's REST description as GitHub publishes it (npm `@octokit/openapi`: 13 MB of JSON,
1,223 operations) as an operator's source: it loads (read as JSON, not through YAML, which
took minutes), the server says what it loaded, and a read reaches a loopback stand-in for
GitHub with its path parameters in place; plain-English questions find the operations they
mean among the 1,223 (`describe_tools`' ranking)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lockgate.machine.policy import Policy
from lockgate.machine.tools.http_calls import HttpLimits
from lockgate.machine.tools.registry import ToolRegistry
from lockgate.machine.tools.source_file import load_sources
from lockgate.server.tool_listing import described
from lockgate.spec import ExecutionStatus as E
from tests.support.engine_records import MakeRuntime
from tests.support.published import GITHUB_QUESTIONS, github_sources_file, github_stand_in

pytestmark = pytest.mark.slow  # installs the published description from npm on first use


@pytest.fixture(name="github_url")
def github_fixture() -> Iterator[str]:
    with github_stand_in() as url:
        yield url


def test_github_s_rest_description_loads_and_serves_a_read(
    make_runtime: MakeRuntime,
    tmp_path: Path,
    github_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sources = github_sources_file(tmp_path, github_url)
    with caplog.at_level("INFO", logger="lockgate.sources"):
        runtime = make_runtime(sources_file=sources)
    assert "loading openapi source 'github'" in caplog.text
    assert "loaded openapi source 'github': 1223 tools in" in caplog.text
    specs = {spec.call_name: spec for spec in runtime.registry.specs()}
    assert "tools.github.repos_get" in specs
    assert specs["tools.github.repos_get"].description.endswith("(GET /repos/{owner}/{repo})")

    done = runtime.engine.execute(
        "alice", "tools.github.repos_get(owner='octocat', repo='Hello-World')"
    )
    assert done.status == E.COMPLETED, done.error
    assert done.result == {"full_name": "octocat/Hello-World", "private": False}


def _github_registry(folder: Path) -> ToolRegistry:
    registry = ToolRegistry()
    for source in load_sources(github_sources_file(folder), HttpLimits()):
        registry.register(source)
    return registry


def test_plain_questions_find_github_s_operations(tmp_path: Path) -> None:
    registry = _github_registry(tmp_path)
    top5 = {q: [spec.name for spec in registry.describe(q)[:5]] for q in GITHUB_QUESTIONS}
    found = [q for q, meant in GITHUB_QUESTIONS.items() if meant in top5[q]]
    # The three a new user tried first, one said only in the operation's description
    # ("Create a workflow dispatch event": "manually trigger a GitHub Actions workflow
    # run"), and nine in ten of all.
    for question in (
        "get a user",
        "get a repository",
        "get file contents",
        "trigger a workflow run",
    ):
        assert question in found, top5[question]
    assert len(found) >= 0.9 * len(GITHUB_QUESTIONS), {
        q: top5[q] for q in GITHUB_QUESTIONS if q not in found
    }


def test_a_tool_shows_its_body_s_fields_and_allowed_values(tmp_path: Path) -> None:
    """What a model reads of GitHub's operations in `describe_tools`: under each signature
    the summary, the body's fields with their types (the required ones marked) and the
    values an argument may take, within a bound per tool."""
    registry = _github_registry(tmp_path)
    text, _ = described(registry, Policy(), "create an issue")
    block = text.split("\ntools.")[0].splitlines()
    assert block[0].startswith("tools.github.issues_create(owner: str, repo: str, body: dict")
    assert block[1] == "    Create an issue (POST /repos/{owner}/{repo}/issues)"
    assert block[2].startswith("    body fields: title: str | int (required), body: str, ")
    assert "labels: list[str | dict {id, name, description, color}]" in block[2]

    text, _ = described(registry, Policy(), "list repository issues")
    listed = next(b for b in text.split("\ntools.") if "issues_list_for_repo(" in b)
    assert "    state: one of 'open' | 'closed' | 'all'" in listed.splitlines()
    # Every tool's detail is bounded, however large its body.
    everything, _ = described(registry, Policy(), "")
    blocks = everything.split("\ntools.")
    assert max(len(b) for b in blocks) < 2500
