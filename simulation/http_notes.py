"""The notes tools again, as an HTTP API with an OpenAPI document: the simulator's OpenAPI
source (`tools.api.*`), so a scenario's writes go through the real OpenAPI source, httpx and
a real HTTP server on loopback, through every crash point of the tool call lifecycle.

The API answers what `NotesSource` answers (`{"key", "text"}`, `{"key", "written": true}`,
...), so a scenario's expectations hold for either source, and logs each write it makes with
the `Idempotency-Key` the source sends (the call's journal id) in the shape of the notes'
effect log, for the invariants that count effects. Reads carry no key and are not logged.

One server per process (a daemon thread), shared by every simulated deployment: each
deployment has its own notes and effects under its own path prefix (`/w/<world>/notes`).
"""

from __future__ import annotations

import os
import threading
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from pydantic import JsonValue
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from lockgate.machine.tools.http_calls import HttpLimits
from lockgate.machine.tools.openapi import OpenApiSource
from lockgate.simulation.ports import free_port

#: The source's name in agent code: `tools.api.write(key=..., text=...)`.
SOURCE = "api"

_KEY: dict[str, JsonValue] = {
    "name": "key",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
}

#: Written by hand as a user's document would be: operation ids are the notes tools' names.
DOCUMENT: dict[str, JsonValue] = {
    "openapi": "3.0.3",
    "info": {"title": "Notes over HTTP", "version": "1"},
    "paths": {
        "/notes": {
            "get": {"operationId": "list", "summary": "List the notes' keys", "responses": {}}
        },
        "/notes/{key}": {
            "get": {
                "operationId": "read",
                "summary": "Read a note",
                "parameters": [_KEY],
                "responses": {},
            },
            "post": {
                "operationId": "write",
                "summary": "Write a note",
                "parameters": [
                    _KEY,
                    {"name": "text", "in": "query", "required": True, "schema": {"type": "string"}},
                ],
                "responses": {},
            },
            "delete": {
                "operationId": "delete",
                "summary": "Delete a note",
                "parameters": [_KEY],
                "responses": {},
            },
        },
    },
}


@dataclass
class _Deployment:
    notes: dict[str, str] = field(default_factory=dict)
    effects: list[dict[str, JsonValue]] = field(default_factory=list)


class NotesApi:
    """The running API: its base URL, and each simulated deployment's notes and effects."""

    def __init__(self) -> None:
        self._worlds: defaultdict[str, _Deployment] = defaultdict(_Deployment)
        self._lock = threading.Lock()
        self.port = free_port()
        app = Starlette(
            routes=[
                Route("/w/{world}/notes", self._list, methods=["GET"]),
                Route("/w/{world}/notes/{key}", self._note, methods=["GET", "POST", "DELETE"]),
            ]
        )
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="sim-notes-api", daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the simulator's notes API did not start")
            self._thread.join(0.01)  # polls uvicorn's own flag; nothing else signals it

    def source(self, world: str) -> OpenApiSource:
        """The OpenAPI source of one deployment's notes."""
        return OpenApiSource(
            SOURCE,
            DOCUMENT,
            base_url=f"http://127.0.0.1:{self.port}/w/{world}",
            limits=HttpLimits(timeout_secs=10),
        )

    def effects(self, world: str) -> list[dict[str, JsonValue]]:
        with self._lock:
            return [dict(e) for e in self._worlds[world].effects]

    def forget(self, world: str) -> None:
        with self._lock:
            self._worlds.pop(world, None)

    async def _list(self, request: Request) -> JSONResponse:
        with self._lock:
            return JSONResponse(sorted(self._worlds[request.path_params["world"]].notes))

    async def _note(self, request: Request) -> JSONResponse:
        world, key = request.path_params["world"], request.path_params["key"]
        with self._lock:
            deployment = self._worlds[world]
            if request.method == "GET":
                if key not in deployment.notes:
                    return JSONResponse({"detail": f"there is no note {key!r}"}, status_code=404)
                return JSONResponse({"key": key, "text": deployment.notes[key]})
            if request.method == "POST":
                deployment.notes[key] = request.query_params.get("text", "")
                answer: dict[str, Any] = {"key": key, "written": True}
            else:
                answer = {"key": key, "deleted": deployment.notes.pop(key, None) is not None}
            deployment.effects.append(
                {
                    "tool": f"{SOURCE}.{'write' if request.method == 'POST' else 'delete'}",
                    "read": False,
                    "key": key,
                    "idempotency_key": request.headers.get("idempotency-key"),
                    "pid": os.getpid(),
                }
            )
        return JSONResponse(answer)


_api: NotesApi | None = None
_api_lock = threading.Lock()


def notes_api() -> NotesApi:
    """The process's API, started on first use."""
    global _api
    with _api_lock:
        if _api is None:
            _api = NotesApi()
        return _api


def new_world_id() -> str:
    return uuid.uuid4().hex


__all__ = ["DOCUMENT", "SOURCE", "NotesApi", "new_world_id", "notes_api"]
