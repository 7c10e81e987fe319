"""GitHub's REST description as GitHub publishes it (npm `@octokit/openapi`: 13 MB of JSON,
1,223 operations) as an operator's source: it loads (read as JSON, not through YAML, which
took minutes), the server says what it loaded, and a read reaches a loopback stand-in for
GitHub with its path parameters in place. How long the load takes is measured in bench/."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from lockgate.spec import ExecutionStatus as E
from tests.support.asgi_thread import serve_in_thread
from tests.support.engine_records import MakeRuntime
from tests.support.published import github_rest_description

pytestmark = pytest.mark.slow  # installs the published description from npm on first use


@pytest.fixture(name="github_url")
def github_fixture() -> Iterator[str]:
    async def repository(request: Request) -> JSONResponse:
        owner, repo = request.path_params["owner"], request.path_params["repo"]
        return JSONResponse({"full_name": f"{owner}/{repo}", "private": False})

    serving = serve_in_thread(
        Starlette(routes=[Route("/repos/{owner}/{repo}", repository)]), "fake-github"
    )
    port = next(serving)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serving.close()


def test_github_s_rest_description_loads_and_serves_a_read(
    make_runtime: MakeRuntime,
    tmp_path: Path,
    github_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    shutil.copy(github_rest_description(), tmp_path / "github.json")
    (tmp_path / "sources.toml").write_text(
        f'[[openapi]]\nname = "github"\ndocument = "github.json"\nbase_url = "{github_url}"\n'
    )
    with caplog.at_level("INFO", logger="lockgate.sources"):
        runtime = make_runtime(sources_file=tmp_path / "sources.toml")
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
