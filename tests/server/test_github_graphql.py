"""GitHub's GraphQL schema as GitHub publishes it (npm `@octokit/graphql-schema`), served by a
loopback endpoint that answers as GitHub would. Its SDL defines fields twice and the schema
breaks GraphQL's interface-deprecation rules: it loads from either form (the SDL file, or
introspection, whose answer is larger than a tool's answer may be), its queries run, its
mutations wait for a person, and a bad document is refused in words before anything is sent."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockgate.machine.runtime import Runtime
from lockgate.spec import ExecutionStatus as E
from tests.support.engine_records import MakeRuntime, caught
from tests.support.published import GitHubGraphQL, serve_github_graphql

pytestmark = pytest.mark.slow  # installs the published schema from npm on first use

ROOT = {"viewer": {"login": "octocat", "name": "The Octocat"}}


@pytest.fixture(name="github")
def github_fixture() -> Iterator[GitHubGraphQL]:
    yield from serve_github_graphql(ROOT)


def github_runtime(
    make_runtime: MakeRuntime, tmp_path: Path, github: GitHubGraphQL, *, sdl: bool
) -> Runtime:
    lines = ["[[graphql]]", 'name = "github"', f'endpoint = "{github.url}"']
    if sdl:
        shutil.copy(github.folder / "schema.graphql", tmp_path / "github.graphql")
        lines.append('schema = "github.graphql"')
    (tmp_path / "sources.toml").write_text("\n".join(lines) + "\n")
    return make_runtime(sources_file=tmp_path / "sources.toml", approval_mode="browser")


@pytest.mark.parametrize("sdl", [True, False], ids=["published-sdl", "introspection"])
def test_github_s_schema_serves_queries_and_refuses_bad_documents_in_words(
    make_runtime: MakeRuntime,
    tmp_path: Path,
    github: GitHubGraphQL,
    sdl: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="lockgate.sources"):
        runtime = github_runtime(make_runtime, tmp_path, github, sdl=sdl)
    # What the schema breaks is said once, at load; it is served as published.
    said = caplog.text
    assert re.search(r"breaks \d+ of GraphQL's rules for schemas", said), said
    assert "must not be deprecated" in said
    if sdl:
        assert "can only be defined once" in said

    done = runtime.engine.execute("alice", 'tools.github.query(query="{ viewer { login } }")')
    assert done.status == E.COMPLETED, done.error
    assert done.result == {"viewer": {"login": "octocat"}}

    # A field GitHub has not: refused in words in the code, nothing sent.
    sent = len(github.received or [])
    bad = runtime.engine.execute(
        "alice", caught('tools.github.query(query="{ viewer { nope } }")')
    )
    assert bad.status == E.COMPLETED, bad.error
    assert "Cannot query field 'nope' on type 'User'" in str(bad.result), bad.result
    assert len(github.received or []) == sent

    # A mutation waits for a person.
    star = 'mutation { addStar(input: {starrableId: "R_1"}) { clientMutationId } }'
    paused = runtime.engine.execute("alice", f"tools.github.mutate(query={star!r})")
    assert paused.status == E.WAITING_FOR_INTERACTION, paused.error
