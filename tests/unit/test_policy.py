from __future__ import annotations

import itertools

import pytest
from pydantic import ValidationError

from lockgate.machine.errors import ErrorCode
from lockgate.machine.policy import (
    InvalidPolicy,
    Policy,
    PolicyDecision,
    PolicyRule,
    ToolBlocked,
    most_restrictive,
)
from lockgate.machine.tools.registry import ToolSpec

APPROVE, REQUIRE, BLOCK = (
    PolicyDecision.APPROVE,
    PolicyDecision.REQUIRE_APPROVAL,
    PolicyDecision.BLOCK,
)


def make_spec(full_name: str, default: PolicyDecision = REQUIRE) -> ToolSpec:
    source, name = full_name.split(".")
    return ToolSpec(source=source, name=name, description="d", default_policy=default)


def rule(pattern: str, decision: PolicyDecision) -> PolicyRule:
    return PolicyRule(pattern=pattern, decision=decision)


@pytest.mark.parametrize("pattern", ["*", "notes.*", "notes.write", "_x.y_2"])
def test_valid_patterns(pattern: str) -> None:
    assert rule(pattern, APPROVE).pattern == pattern


@pytest.mark.parametrize(
    "pattern",
    ["", "notes", "notes.", "*.write", "notes.*.x", "a.b.c", "no tes.x", "tools.notes.write", "**"],
)
def test_invalid_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(ValidationError, match="pattern"):
        rule(pattern, APPROVE)


def test_tools_prefix_gets_a_specific_message() -> None:
    with pytest.raises(ValidationError, match=r"must not start with 'tools\.'"):
        rule("tools.notes.*", APPROVE)


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("*", "notes.write", True),
        ("notes.*", "notes.write", True),
        ("notes.*", "notesx.write", False),  # the dot is part of the prefix
        ("notes.*", "other.write", False),
        ("notes.write", "notes.write", True),
        ("notes.write", "notes.writer", False),
    ],
)
def test_rule_matching(pattern: str, name: str, expected: bool) -> None:
    assert rule(pattern, APPROVE).matches(make_spec(name)) is expected


def test_no_matching_rule_falls_back_to_the_tool_default() -> None:
    policy = Policy([rule("other.*", BLOCK)])
    assert policy.decide(make_spec("notes.write", REQUIRE)) is REQUIRE
    assert policy.decide(make_spec("notes.read", APPROVE)) is APPROVE
    assert Policy().decide(make_spec("notes.read", BLOCK)) is BLOCK


def test_a_matching_approve_rule_overrides_a_stricter_default() -> None:
    # The executor's rule: a policy `approve` never pauses, whatever the tool's default.
    assert Policy([rule("notes.*", APPROVE)]).decide(make_spec("notes.write")) is APPROVE


@pytest.mark.parametrize(
    "rules",
    list(
        itertools.permutations(
            [rule("*", APPROVE), rule("notes.*", REQUIRE), rule("notes.delete", BLOCK)]
        )
    ),
)
def test_most_restrictive_wins_in_any_order(rules: tuple[PolicyRule, ...]) -> None:
    policy = Policy(rules)
    assert policy.decide(make_spec("notes.delete", APPROVE)) is BLOCK
    assert policy.decide(make_spec("notes.write", APPROVE)) is REQUIRE
    assert policy.decide(make_spec("mail.send", REQUIRE)) is APPROVE


def test_most_restrictive_helper() -> None:
    assert most_restrictive([]) is None
    assert most_restrictive([APPROVE, BLOCK, REQUIRE]) is BLOCK
    assert most_restrictive([APPROVE, REQUIRE]) is REQUIRE


def test_matching_lists_the_rules_that_apply() -> None:
    policy = Policy.from_text("*=approve,notes.*=require_approval,mail.*=block")
    assert [str(r) for r in policy.matching(make_spec("notes.read"))] == [
        "*=approve",
        "notes.*=require_approval",
    ]


def test_from_text_parses_the_compact_form() -> None:
    policy = Policy.from_text(" notes.* = approve ,\n notes.delete=BLOCK,, *=require_approval,\n")
    assert policy.rules == (
        rule("notes.*", APPROVE),
        rule("notes.delete", BLOCK),
        rule("*", REQUIRE),
    )
    assert policy.decide(make_spec("notes.delete")) is BLOCK
    assert policy.to_text() == "notes.*=approve,notes.delete=block,*=require_approval"
    assert Policy.from_text(policy.to_text()).rules == policy.rules
    assert "notes.delete=block" in repr(policy)


@pytest.mark.parametrize("text", ["", "  ", ",\n,"])
def test_from_text_empty_means_no_rules(text: str) -> None:
    assert Policy.from_text(text).rules == ()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("notes.*", "has no '='"),
        ("notes.*=maybe", "unknown decision 'maybe' (expected one of approve, require_approval"),
        # The first '=' splits: a second one is part of the decision, and so refused.
        ("notes.*=approve=block", "unknown decision 'approve=block'"),
        ("notes=approve", "pattern 'notes' is not one of"),
        ("tools.notes.*=approve", "must not start with 'tools.'"),
        ("=approve", "pattern '' is not one of"),
        ("notes.*=approve,notes.*=block", "pattern 'notes.*' is already given as 'notes.*=app"),
    ],
)
def test_from_text_errors_say_what_and_how(text: str, message: str) -> None:
    with pytest.raises(InvalidPolicy) as caught:
        Policy.from_text(text)
    assert message in caught.value.message
    assert caught.value.code is ErrorCode.INVALID_INPUT
    assert caught.value.hint is not None and "notes.*=approve" in caught.value.hint


def test_tool_blocked_error() -> None:
    error = ToolBlocked(tool="notes.delete")
    assert error.as_dict()["code"] == "blocked"
    assert "tools.notes.delete is blocked by policy" in error.message
    assert error.hint


def operation_spec(full_name: str, operation: str | None) -> ToolSpec:
    source, name = full_name.split(".")
    return ToolSpec(source=source, name=name, description="d", operation=operation)


def test_a_condition_limits_a_rule_to_the_calls_making_that_operation() -> None:
    policy = Policy.from_text("api.*[delete]=block,gql.*[MUTATION]=block,*[GET]=approve")
    # Conditions are stored normalized: methods upper case, operation types lower case.
    assert policy.to_text() == "api.*[DELETE]=block,gql.*[mutation]=block,*[GET]=approve"
    assert policy.decide(operation_spec("api.remove_pet", "DELETE")) is BLOCK
    assert policy.decide(operation_spec("api.add_pet", "POST")) is REQUIRE  # its default
    assert policy.decide(operation_spec("api.get_pet", "GET")) is APPROVE
    assert policy.decide(operation_spec("gql.mutate", "mutation")) is BLOCK
    assert policy.decide(operation_spec("gql.query", "query")) is REQUIRE
    assert policy.decide(operation_spec("notes.write", None)) is REQUIRE  # no operation


def test_the_same_pattern_under_two_conditions_is_two_rules() -> None:
    assert len(Policy.from_text("api.*[GET]=approve,api.*[POST]=block").rules) == 2
    with pytest.raises(InvalidPolicy, match="already given"):
        Policy.from_text("api.*[GET]=approve,api.*[get]=block")


@pytest.mark.parametrize("text", ["api.*[FETCH]=block", "api.*[]=block", "*[query=block"])
def test_an_unknown_condition_is_refused_naming_what_a_condition_may_be(text: str) -> None:
    with pytest.raises(InvalidPolicy) as caught:
        Policy.from_text(text)
    assert "policy entry" in caught.value.message


def test_a_tool_operation_must_be_one_a_rule_can_name() -> None:
    with pytest.raises(ValidationError, match="HTTP method"):
        operation_spec("api.x", "FETCH")
