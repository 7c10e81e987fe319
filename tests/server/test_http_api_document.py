"""The HTTP API's document, `/openapi.json`, against a real server on a loopback port.

- **It names every route with its credentials.** Read over HTTP, the document holds each
  JSON route of the API (and nothing else: not the HTML pages, not /mcp) with the security
  it takes: the principal's API key, a person's session cookie (with the CSRF header where
  the request changes something), or nothing; and the version of the installed package.
- **The server keeps to it, under fuzzing.** Schemathesis generates requests from the
  document, valid and invalid, and checks every answer: never a 5xx, every status
  documented, every body, content type and header as documented, an invalid request
  refused and a valid one not refused as invalid.
- **Two principals never cross.** alice and bob each have paused executions, made through
  /mcp `execute` as an agent makes them, and an approver of their own (Ann approves for
  alice only, Bea for bob only). The fuzzing runs with one side's API key and approver's
  session, and sends both sides' execution ids as path parameters among the generated
  ones. No answer carries anything of the other side's: not its code or its call's
  arguments, not its key, no answer that succeeded names its executions; and afterwards its
  executions still wait, undecided. Then the same the other way round.

The fuzzing is bounded (a fixed number of examples per operation and mode, derandomized:
the same requests on every run) and runs on SQLite: the routes' checks are the same on both
stores, which the approval tests cover.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx2
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, CheckContext, GenerationMode, Response
from schemathesis.core.result import Ok
from schemathesis.schemas import APIOperation, BaseSchema

from lockgate.machine.runtime import Runtime
from lockgate.machine.secrets import StaticSecrets
from lockgate.machine.settings import Settings
from lockgate.machine.tools.notes import NotesSource
from lockgate.server.keys import ApiKeys
from tests.support.approval_app import PRINCIPAL, Served, mcp_execute, serve
from tests.support.canary import CANARY
from tests.support.people import Approver

pytestmark = pytest.mark.slow

#: Every operation of the document, with the credentials it takes (one requirement: all of
#: them at once). Health and readiness take none; /metrics takes a key only where the
#: operator asked for one (LOCKGATE_METRICS_REQUIRE_KEY, on for the fuzzed server).
KEY, PERSON, CHANGE = ["apiKey"], ["personSession"], ["csrfToken", "personSession"]
ROUTES: dict[tuple[str, str], list[str]] = {
    ("GET", "/healthz"): [],
    ("GET", "/readyz"): [],
    ("GET", "/metrics"): KEY,
    ("GET", "/api/executions/{execution_id}"): KEY,
    ("POST", "/api/executions/{execution_id}/resume"): KEY,
    ("GET", "/api/approvals"): PERSON,
    ("GET", "/api/approvals/{execution_id}/{call}"): PERSON,
    ("POST", "/api/approvals/{execution_id}/{call}"): CHANGE,
    ("POST", "/signin/passkey/options"): [],
    ("POST", "/signin/passkey"): [],
    ("POST", "/signout"): CHANGE,
    ("POST", "/enrol/{token}/options"): [],
    ("POST", "/enrol/{token}"): [],
}
#: The operations no fuzzed request can pass: a passkey's proof, an enrolment link's secret.
NEVER_ACCEPTED = {"POST /signin/passkey", "POST /enrol/{token}/options", "POST /enrol/{token}"}

#: Per operation and mode: enough to reach every refusal a route has, small enough that
#: each side's fuzzing takes seconds.
EXAMPLES = {GenerationMode.POSITIVE: 25, GenerationMode.NEGATIVE: 15}
#: With a known execution id pinned (each side's), per id.
PINNED_EXAMPLES = 6


def serving(folder: Path, **overrides: Any) -> Any:
    """The real app on a loopback port (`serve`), on a SQLite file in `folder`, with the
    notes tool and the canary secret as the other tests have them, in approval mode
    `browser` (only a person accepts)."""

    def build(**settings: Any) -> Runtime:
        return Runtime.create(
            Settings(
                database_url=f"sqlite:///{folder / 'lockgate.db'}",
                notes_dir=folder / "notes",
                max_duration_secs=5,
                approval_mode="browser",
                **settings,
            ),
            sources=[NotesSource(folder / "notes")],
            secrets=StaticSecrets({"notes_token": CANARY}),
        )

    return serve(build, **overrides)


def document(served: Served) -> dict[str, Any]:
    response = served.get("/openapi.json")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    found: dict[str, Any] = response.json()
    return found


# -- the document -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server whose /metrics asks for a key."""
    with serving(tmp_path_factory.mktemp("keyed"), metrics_require_key=True) as served:
        yield served


def test_the_document_names_every_route_with_its_credentials(keyed: Served) -> None:
    served = keyed
    doc = document(served)
    assert doc["openapi"].startswith("3.")
    assert doc["info"]["title"] == "Lockgate"
    assert doc["info"]["version"] == version("lockgate")

    operations = {
        (method.upper(), path): operation
        for path, item in doc["paths"].items()
        for method, operation in item.items()
    }
    # Exactly the JSON API: no page, no /mcp, no HEAD twin.
    assert set(operations) == set(ROUTES), sorted(set(operations) ^ set(ROUTES))
    for route, needs in ROUTES.items():
        operation = operations[route]
        assert [sorted(r) for r in operation["security"]] == ([needs] if needs else []), route
        responses = operation["responses"]
        assert "422" not in responses, route  # FastAPI's own refusal is never answered here
        for status, answer in responses.items():
            if status.startswith("4"):  # (a 503 of /readyz is its status, not a refusal)
                schema = answer["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/Problem"}, (route, status)
        if needs:
            assert "401" in responses, route

    schemes = doc["components"]["securitySchemes"]
    assert schemes["apiKey"] | {"description": ""} == {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "lg_...",
        "description": "",
    }
    # The cookie the server sets (on http: `__Host-` needs https), and the header it reads.
    assert (schemes["personSession"]["in"], schemes["personSession"]["name"]) == (
        "cookie",
        "lockgate_person",
    )
    assert (schemes["csrfToken"]["in"], schemes["csrfToken"]["name"]) == (
        "header",
        "X-CSRF-Token",
    )
    # The request bodies are the models the routes validate.
    resume = operations[("POST", "/api/executions/{execution_id}/resume")]
    body = resume["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/ResumeBody"}
    assert doc["components"]["schemas"]["ResumeBody"]["additionalProperties"] is False
    assert "ValidationError" not in doc["components"]["schemas"]

    # Read without any credential, and no interactive page (it would load a script from
    # elsewhere).
    with httpx2.Client(timeout=10.0) as bare:
        assert bare.get(served.url + "/openapi.json").status_code == 200
        assert bare.get(served.url + "/docs").status_code == 404


def test_metrics_open_to_all_is_documented_so(tmp_path: Path) -> None:
    with serving(tmp_path) as served:
        metrics = document(served)["paths"]["/metrics"]["get"]
        assert metrics["security"] == []
        assert "401" not in metrics["responses"]
        assert served.get("/metrics").status_code == 200


# -- the server under fuzzing -------------------------------------------------------------


@dataclass
class Side:
    """A principal, its paused executions (made through /mcp), and people who approve for
    it alone."""

    principal: str
    key: str
    #: In its code and its calls' arguments: never shown to the other side.
    marks: tuple[str, str]
    ids: list[str]
    #: Decides under fuzzing.
    person: Approver
    #: Signs out under fuzzing (so that `person`'s session lasts for the other routes).
    leaver: Approver

    def code(self, n: int) -> str:
        mark, text = self.marks
        return f'# {mark}\ntools.notes.write(key="{self.principal}-{n}", text="{text}")\n"done"'

    def pause(self, served: Served, n: int) -> str:
        answer = mcp_execute(served, self.code(n), key=self.key)
        assert answer["status"] == "waiting_for_interaction", answer
        return str(answer["executionId"])


@dataclass
class Fuzzed:
    served: Served
    #: Whose credentials the fuzzing sends.
    us: Side
    #: Whose data must never reach `us`.
    them: Side


@pytest.fixture(params=["alice fuzzes", "bob fuzzes"])
def fuzzed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fuzzed]:
    with serving(
        tmp_path,
        metrics_require_key=True,
        # Fuzzing sends hundreds of requests a minute with one key: the rate is not what is
        # tested here (test_principal_bounds is).
        max_requests_per_minute=100_000,
    ) as served:
        keys = {
            PRINCIPAL: served.key,
            "bob": ApiKeys(served.runtime.engine.store).create("bob").secret,
        }
        people = {PRINCIPAL: ("Ann", "Al"), "bob": ("Bea", "Bo")}
        sides = []
        for principal, key in keys.items():
            person, leaver = (served.person(name, (principal,)) for name in people[principal])
            marks = (f"{principal}-private-7c1e94", f"{principal}-note-body-52a0d3")
            side = Side(principal, key, marks, [], person, leaver)
            side.ids = [side.pause(served, n) for n in range(2)]
            sides.append(side)
        alice, bob = sides
        yield (
            Fuzzed(served, alice, bob)
            if request.param == "alice fuzzes"
            else Fuzzed(served, bob, alice)
        )


def _never_shown(them: Side) -> Callable[[CheckContext, Response, Case[Any]], None]:
    """A check: nothing of `them` in an answer to `us`."""
    secrets = [*them.marks, them.key]

    def owned(value: Any) -> bool:
        if isinstance(value, dict):
            mine = them.principal in (value.get("requestedBy"), value.get("principal"))
            return mine or any(owned(v) for v in value.values())
        return isinstance(value, list) and any(owned(v) for v in value)

    def nothing_of_theirs(ctx: CheckContext, response: Response, case: Case[Any]) -> None:
        text = response.text or ""
        for secret in secrets:
            assert secret not in text, f"{them.principal}'s {secret!r} in: {text[:500]}"
        if 200 <= response.status_code < 300:
            # A refusal may repeat the id the request sent; an answer that succeeded never
            # names their executions.
            for their_id in them.ids:
                assert their_id not in text, f"{them.principal}'s {their_id} in: {text[:500]}"
        if response.headers.get("content-type", [""])[0].startswith("application/json"):
            assert not owned(json.loads(text or "null")), text[:500]

    return nothing_of_theirs


def _schema(served: Served, key: str, person: Approver) -> BaseSchema:
    """The document as read from the server, with `key` and `person`'s session for its
    security schemes: schemathesis sends them where an operation names them (and leaves one
    out, or spoils it, where it tests the refusal)."""
    auth = {
        "apiKey": {"bearer": key},
        "personSession": {"api_key": person.cookie},
        "csrfToken": {"api_key": person.csrf},
    }
    config = schemathesis.Config.from_dict({"auth": {"openapi": auth}})
    return schemathesis.openapi.from_url(served.url + "/openapi.json", config=config)


def _operations(served: Served, us: Side) -> Iterator[APIOperation[Any, Any, Any, Any]]:
    """Every operation, each with `us.person`'s session but signing out, which has
    `us.leaver`'s."""
    deciding, leaving = _schema(served, us.key, us.person), _schema(served, us.key, us.leaver)
    for result in deciding.get_all_operations():
        assert isinstance(result, Ok), result
        operation = result.ok()
        yield leaving["/signout"]["POST"] if operation.path == "/signout" else operation


def _fuzz(
    fuzzed: Fuzzed, strategy: st.SearchStrategy[Case[Any]], examples: int, seen: set[int]
) -> None:
    """Send `examples` cases of `strategy` (the same ones every run), checking each answer
    against the document and for the other side's data; the statuses go to `seen`."""
    check = _never_shown(fuzzed.them)

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=timedelta(seconds=10),
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Case[Any]) -> None:
        response = case.call(base_url=fuzzed.served.url)
        seen.add(response.status_code)
        assert response.status_code < 500, (case.method, case.formatted_path, response.text)
        case.validate_response(response, additional_checks=[check])

    run()


def test_the_server_keeps_to_its_document_and_principals_never_cross(fuzzed: Fuzzed) -> None:
    us, them, served = fuzzed.us, fuzzed.them, fuzzed.served
    answered: dict[str, set[int]] = {}
    for operation in _operations(served, us):
        name = f"{operation.method.upper()} {operation.path}"
        seen = answered.setdefault(name, set())
        for mode, examples in EXAMPLES.items():
            try:
                _fuzz(fuzzed, operation.as_strategy(generation_mode=mode), examples, seen)
            except Unsatisfiable:
                # Nothing this operation takes can be sent wrong (no body, no parameter whose
                # schema a value could break: any string is an execution id).
                assert mode is GenerationMode.NEGATIVE, name
        names = {parameter.name for parameter in operation.path_parameters}
        if "execution_id" in names:
            # Real ids, both sides', on the call they wait on: the ownership checks are what
            # answers these. A fresh one of ours, since the operations fuzzed before may
            # have declined the others.
            fresh = us.pause(served, len(answered) + 10)
            for known in [fresh, *us.ids, *them.ids]:
                pinned = {"execution_id": known} | ({"call": 1} if "call" in names else {})
                strategy = operation.as_strategy(path_parameters=pinned)
                _fuzz(fuzzed, strategy, PINNED_EXAMPLES, seen)
    assert set(answered) == {f"{m} {p}" for m, p in ROUTES}
    # The credentials worked: every operation answered a request that succeeded, but those
    # only a passkey or an enrolment link's secret gets through.
    for name, seen in answered.items():
        succeeded = any(200 <= status < 300 for status in seen)
        assert succeeded is (name not in NEVER_ACCEPTED), (name, sorted(seen))

    # Nothing sent with our credentials decided or changed anything of theirs.
    for their_id in them.ids:
        view = served.runtime.engine.view(their_id)
        assert view.status == "waiting_for_interaction", view
        assert [c.status for c in view.calls] == ["awaiting_approval"], view.calls
