"""Policy rules stored in the database: global or one principal's, with conditions on what a
call does (HTTP method, GraphQL operation type), weighed with LOCKGATE_POLICY (most
restrictive wins), managed with `lockgate policy add|list|remove`, and shown per principal
in the listings.

Two principals throughout: a rule written for one must never reach the other.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lockgate.machine.db.schema import PolicyRuleRow
from lockgate.machine.engine import Action
from lockgate.machine.policy import InvalidPolicy, Policy, PolicyDecision
from lockgate.machine.policy_book import PolicyBook
from lockgate.machine.runtime import Runtime
from lockgate.machine.tools.graphql_source import GraphQLSource, schema_from_sdl
from lockgate.machine.tools.spec import ToolSpec
from lockgate.server.policy_rules import PolicyRules
from lockgate.spec import ExecutionStatus
from tests.support.engine_records import MakeRuntime, caught
from tests.support.http_api import ItemsApi, RunningApi, serve, sources_file
from tests.support.servers import (
    Deployment,
    mcp_client,
    run,
    structured,
)

pytest_plugins = ["tests.support.servers"]

CREATE = 'tools.items.create_item(body={"name": "pen", "price": 1.5})'
DELETE = "tools.items.delete_item_items__item_id__delete(item_id=1)"


@pytest.fixture(name="api")
def api_fixture() -> Iterator[RunningApi]:
    yield from serve(ItemsApi())


def items_runtime(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi, **settings: Any
) -> Runtime:
    # Refreshed at every decision: these tests add rules and expect them at once.
    path = sources_file(tmp_path, api)
    return make_runtime(sources_file=path, policy_refresh_secs=0, **settings)


def test_a_principal_s_rule_and_a_method_condition_decide_only_for_whom_they_name(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    rt = items_runtime(make_runtime, tmp_path, api)
    rules = PolicyRules(rt.engine.store)
    rules.add("*", "block", condition="DELETE")  # everyone's deletes
    rules.add("items.*", "block", condition="post", principal="alice")  # alice's creates

    # alice's create is refused in her code, without a pause and without reaching the API.
    alice = rt.engine.execute("alice", caught(CREATE))
    assert alice.status is ExecutionStatus.COMPLETED, alice.error
    assert alice.result == (
        "PermissionError: tools.items.create_item is blocked by the server's policy"
    )
    assert api.api.effects == []

    # bob's same call keeps the default: it waits for a person, then is made once.
    bob = rt.engine.execute("bob", CREATE)
    assert bob.status is ExecutionStatus.WAITING_FOR_INTERACTION
    done = rt.engine.resume(bob.id, "bob", Action.ACCEPT)
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert api.api.effects == [{"created": 1}]

    # The global DELETE rule holds for both; a GET is untouched by either rule.
    for principal in ("alice", "bob"):
        gone = rt.engine.execute(principal, caught(DELETE))
        assert gone.status is ExecutionStatus.COMPLETED, gone.error
        assert "is blocked by the server's policy" in str(gone.result)
        read = rt.engine.execute(principal, "tools.items.list_items()")
        assert read.status is ExecutionStatus.COMPLETED, read.error
    assert api.api.effects == [{"created": 1}]


def test_the_most_restrictive_of_configured_global_and_own_rules_wins(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    # The operator's configuration approves creates for everyone; a stored rule for alice
    # blocks them for her alone, and a removed rule stops counting.
    rt = items_runtime(make_runtime, tmp_path, api, policy="items.create_item=approve")
    rules = PolicyRules(rt.engine.store)
    blocked = rules.add("items.create_item", "block", principal="alice")

    bob = rt.engine.execute("bob", CREATE)
    assert bob.status is ExecutionStatus.COMPLETED, bob.error  # approved: made at once
    alice = rt.engine.execute("alice", caught(CREATE))
    assert "blocked" in str(alice.result)
    assert api.api.effects == [{"created": 1}]

    rules.remove(blocked.id)
    again = rt.engine.execute("alice", CREATE)
    assert again.status is ExecutionStatus.COMPLETED, again.error
    assert api.api.effects == [{"created": 1}, {"created": 2}]


def test_a_graphql_rule_on_mutations_leaves_queries_alone() -> None:
    sdl = "type Query { a: Int } type Mutation { b: Int }"
    source = GraphQLSource("shop", "http://127.0.0.1:9/graphql", schema_from_sdl("shop", sdl))
    specs = {tool.spec.name: tool.spec for tool in source.tools()}
    policy = Policy.from_text("shop.*[mutation]=block")
    assert policy.decide(specs["mutate"]) is PolicyDecision.BLOCK
    assert policy.decide(specs["query"]) is PolicyDecision.APPROVE


class FakeRules:
    """The store's `applying_to`, counting reads."""

    def __init__(self) -> None:
        self.rows: list[PolicyRuleRow] = []
        self.reads = 0

    def __call__(self, principal: str | None) -> list[PolicyRuleRow]:
        self.reads += 1
        return [r for r in self.rows if r.principal_id in (None, principal)]


def _row(principal: str | None, decision: str) -> PolicyRuleRow:
    from datetime import UTC, datetime

    return PolicyRuleRow(
        id=decision, principal_id=principal, pattern="*", decision=decision,
        created_at=datetime.now(UTC),
    )  # fmt: skip


def test_stored_rules_are_read_again_once_the_refresh_passes_and_the_cache_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import lockgate.machine.policy_book as policy_book

    now = [0.0]
    stored = FakeRules()
    book = PolicyBook(Policy(), stored, refresh_secs=2.0, clock=lambda: now[0])
    spec = ToolSpec(source="s", name="t", description="d")
    assert book.decide(spec, "alice") is PolicyDecision.REQUIRE_APPROVAL
    stored.rows.append(_row("alice", "block"))
    # Within the refresh the decision is the one read (no read per call) ...
    assert book.decide(spec, "alice") is PolicyDecision.REQUIRE_APPROVAL
    assert stored.reads == 1
    now[0] = 2.5  # ... and after it, the stored rule counts.
    assert book.decide(spec, "alice") is PolicyDecision.BLOCK
    assert book.decide(spec, "bob") is PolicyDecision.REQUIRE_APPROVAL

    monkeypatch.setattr(policy_book, "CACHED_PRINCIPALS", 3)
    for n in range(10):
        book.decide(spec, f"p{n}")
    assert len(book._cache) == 3  # the least recently used left


# -- the operator's commands, and what each principal's client is shown ------------------------


@pytest.mark.slow
def test_policy_commands_and_each_principal_s_listing(deployment: Deployment) -> None:
    added = deployment.cli("policy", "add", "notes.write", "block", "--principal", "alice")
    assert added.returncode == 0, added.stderr
    assert "added" in added.stdout and "notes.write=block" in added.stdout
    rule_id = added.stdout.split()[1]
    again = deployment.cli("policy", "add", "notes.write", "block", "--principal", "alice")
    assert again.returncode == 0 and f"already stored as {rule_id}" in again.stdout

    wrong = deployment.cli("policy", "add", "notes.write", "forbid")
    assert wrong.returncode == 2 and "unknown decision" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    wrong = deployment.cli("policy", "add", "tools.notes.write", "block")
    assert wrong.returncode == 2 and "must not start with 'tools.'" in wrong.stderr
    wrong = deployment.cli("policy", "add", "*", "block", "--when", "FETCH")
    assert wrong.returncode == 2 and "HTTP method" in wrong.stderr
    missing = deployment.cli("policy", "remove", "nope")
    assert missing.returncode == 1 and "lockgate policy list" in missing.stderr

    listed = deployment.cli("policy", "list", "--principal", "alice", "--tools")
    assert listed.returncode == 0, listed.stderr
    assert rule_id in listed.stdout
    effective = dict(
        line.split() for line in listed.stdout.split("effective for alice:", 1)[1].splitlines()
        if line.strip()
    )  # fmt: skip
    assert effective["tools.notes.write"] == "block"
    assert effective["tools.notes.read"] == "approve"
    bob = deployment.cli("policy", "list", "--principal", "bob")
    assert rule_id not in bob.stdout  # alice's rule is not bob's

    server = deployment.start(LOCKGATE_POLICY_REFRESH_SECS="0")
    keys = {name: deployment.create_key(name) for name in ("alice", "bob")}

    async def listing(principal: str) -> dict[str, Any]:
        async with mcp_client(server.url, keys[principal].secret, "legacy") as client:
            described = await client.call_tool("describe_tools", {})
            return {entry["name"]: entry for entry in structured(described)["tools"]}

    assert run(listing("alice"))["tools.notes.write"]["policy"] == "block"
    assert run(listing("bob"))["tools.notes.write"]["policy"] == "require_approval"

    removed = deployment.cli("policy", "remove", rule_id)
    assert removed.returncode == 0 and rule_id in removed.stdout
    assert run(listing("alice"))["tools.notes.write"]["policy"] == "require_approval"


def test_an_overlong_pattern_is_refused_before_it_is_stored(
    make_runtime: MakeRuntime, tmp_path: Path, api: RunningApi
) -> None:
    rt = items_runtime(make_runtime, tmp_path, api)
    rules = PolicyRules(rt.engine.store)
    with pytest.raises(InvalidPolicy, match="longer than 300 characters"):
        rules.add("a" * 200 + "." + "b" * 200, "block")
    assert rules.listed() == []
