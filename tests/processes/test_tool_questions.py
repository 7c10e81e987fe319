"""A tool that asks its user for values (`ToolContext.ask`): its call pauses its execution
durably with its questions; answers come one at a time, from any door, after restarts, and
the call is made once, with all of them. Engine tests run on SQLite and PostgreSQL; the
doors are tested on a real `lockgate serve` with the real SDK client (2025 elicitation, and
`resume` for a client that cannot be asked) and raw 2026-07-28 requests (input_required
rounds across a SIGKILL, the tasks extension one answer at a time)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from pydantic import JsonValue

from lockgate.machine.call_answers import InvalidAnswer, NotApproval
from lockgate.machine.db.inbox_queries import InboxQueries
from lockgate.machine.engine import Action
from lockgate.machine.execution_errors import ExecutionExpired, ExecutionNotFound
from lockgate.machine.policy import PolicyDecision
from lockgate.machine.runtime import Runtime
from lockgate.machine.tools import Tool, ToolContext, ToolSpec
from lockgate.machine.tools.notes import NotesSource
from lockgate.machine.tools.questions import Question
from lockgate.simulation.desk import DeskSource, tag_answer, text_answer
from lockgate.spec import ExecutionStatus, ToolCallStatus
from tests.support.direct_servers import direct_settings, sqlite_deployment_fixture  # noqa: F401
from tests.support.engine_records import Clock, MakeRuntime, calls_of, writes
from tests.support.mcp_calls import mcp_client, run, structured, text_of
from tests.support.server_deployment import Deployment
from tests.support.tasks_client import TasksClient, acked, poll

COMPOSE = 'tools.desk.compose(key="k")'


def _runtime(make_runtime: MakeRuntime, tmp_path: Path, **settings: Any) -> Runtime:
    notes = NotesSource(tmp_path / "notes")
    rt = make_runtime(sources=[notes, DeskSource(notes)], **settings)
    rt.start(background=False)
    return rt


# -- the engine ------------------------------------------------------------------------------


def test_a_tool_that_asks_pauses_its_execution_with_its_questions_and_acts_on_none(
    make_runtime: MakeRuntime, tmp_path: Path
) -> None:
    rt = _runtime(make_runtime, tmp_path)
    view = rt.engine.execute("alice", COMPOSE)
    assert view.status is ExecutionStatus.WAITING_FOR_INTERACTION
    assert view.pending is not None and view.pending.questions is not None
    assert list(view.pending.questions) == ["text", "tag"]
    assert view.pending.questions["text"] == {
        "method": "elicitation/create",
        "params": {
            "message": "What should the note say?",
            "requestedSchema": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
        },
    }
    assert "asks its user" in view.pending.message
    [call] = calls_of(rt, view.id)
    assert call.status == ToolCallStatus.AWAITING_INPUT
    assert writes(rt) == []  # it asked before it acted


def test_answers_come_one_at_a_time_across_a_restart_and_the_call_is_made_once_with_all(
    make_runtime: MakeRuntime, tmp_path: Path
) -> None:
    rt = _runtime(make_runtime, tmp_path)
    view = rt.engine.execute("alice", COMPOSE)
    half = rt.engine.answers.give(view.id, "alice", {"text": text_answer("buy milk")})
    assert half.status is ExecutionStatus.WAITING_FOR_INTERACTION
    assert half.pending is not None and list(half.pending.questions or {}) == ["tag"]
    # Answered again (a client's retry), or answering what nobody asked: ignored.
    again = rt.engine.answers.give(
        view.id, "alice", {"text": text_answer("other"), "colour": text_answer("red")}
    )
    assert again.pending is not None and list(again.pending.questions or {}) == ["tag"]

    later = _runtime(make_runtime, tmp_path)  # a new incarnation on the same database
    done = later.engine.answers.give(view.id, "alice", {"tag": tag_answer("home")})
    assert done.status is ExecutionStatus.COMPLETED, done
    assert done.result == {"key": "k", "text": "buy milk #home"}
    [made] = writes(rt)
    assert made["idempotency_key"] == f"{view.id}:1"


def test_an_answer_that_does_not_fit_its_question_is_refused_in_words_and_kept_open(
    make_runtime: MakeRuntime, tmp_path: Path
) -> None:
    rt = _runtime(make_runtime, tmp_path)
    view = rt.engine.execute("alice", COMPOSE)
    wrong: Sequence[JsonValue] = (
        12345,
        {"action": "maybe"},
        {"action": "accept"},
        {"action": "accept", "content": {"text": 5}},
    )
    for answer in wrong:
        with pytest.raises(InvalidAnswer) as refused:
            rt.engine.answers.give(view.id, "alice", {"text": answer})
        assert "'text'" in refused.value.message and refused.value.hint
    still = rt.engine.get(view.id, "alice")
    assert still.pending is not None and list(still.pending.questions or {}) == ["text", "tag"]
    # Declining is an answer too: the tool reads it.
    declined = rt.engine.answers.give(
        view.id, "alice", {"text": {"action": "decline"}, "tag": {"action": "cancel"}}
    )
    assert declined.status is ExecutionStatus.COMPLETED
    assert declined.result == {"key": "k", "text": "None #"}


def test_a_decision_is_not_an_answer_and_no_other_principal_can_answer(
    make_runtime: MakeRuntime, tmp_path: Path
) -> None:
    rt = _runtime(make_runtime, tmp_path)
    view = rt.engine.execute("alice", COMPOSE)
    with pytest.raises(NotApproval) as refused:
        rt.engine.resume(view.id, "alice", Action.ACCEPT)
    assert "waits for answers" in refused.value.message
    with pytest.raises(ExecutionNotFound):
        rt.engine.answers.give(view.id, "mallory", {"text": text_answer("x")})
    # A paused call for approval asks nothing: answers are refused there, in words.
    approval = rt.engine.execute("alice", 'tools.notes.write(key="a", text="b")')
    with pytest.raises(Exception, match="not for answers"):
        rt.engine.answers.give(approval.id, "alice", {"text": text_answer("x")})
    # The approvals inbox lists the approval, never the questions (the client's to answer).
    waiting = InboxQueries(rt.engine.store.engine).waiting(None, 10)
    assert waiting == [(approval.id, "alice")]
    # Cancelling the execution withdraws the call that asked.
    cancelled = rt.engine.resume(view.id, "alice", Action.CANCEL)
    assert cancelled.status is ExecutionStatus.CANCELLED
    assert [c.status for c in calls_of(rt, view.id)] == [ToolCallStatus.WITHDRAWN]


def test_questions_nobody_answers_expire_with_their_execution(
    make_runtime: MakeRuntime, tmp_path: Path
) -> None:
    clock = Clock()
    rt = _runtime(make_runtime, tmp_path, clock=clock)
    view = rt.engine.execute("alice", COMPOSE)
    clock.advance(rt.settings.approval_ttl)
    with pytest.raises(ExecutionExpired):
        rt.engine.answers.give(view.id, "alice", {"text": text_answer("late")})
    assert [c.status for c in calls_of(rt, view.id)] == [ToolCallStatus.EXPIRED]
    assert writes(rt) == []


SNEAKY = ToolSpec(
    source="sneaky",
    name="peek",
    description="Asks without saying so",
    idempotent=True,
    default_policy=PolicyDecision.APPROVE,
)


@dataclass(frozen=True)
class _Sneaky:
    """A tool that asks without declaring it may (`asks=False`): made at once, where its
    questions could not pause it."""

    spec: ToolSpec = SNEAKY

    def call(self, arguments: dict[str, JsonValue], context: ToolContext) -> JsonValue:
        return str(context.ask({"q": Question("Well?", {"type": "object", "properties": {}})}))


class _SneakySource:
    name = "sneaky"

    def tools(self) -> Sequence[Tool]:
        return [_Sneaky()]


def test_a_tool_that_asks_without_declaring_it_fails_its_call_in_words(
    make_runtime: MakeRuntime,
) -> None:
    rt = make_runtime(sources=[_SneakySource()])
    code = "try:\n    tools.sneaky.peek()\nexcept RuntimeError as e:\n    got = str(e)\ngot"
    view = rt.engine.execute("alice", code)
    assert view.status is ExecutionStatus.COMPLETED
    assert "asked for input it does not declare" in str(view.result)


# -- the doors -------------------------------------------------------------------------------


def test_a_2025_client_is_asked_each_round_in_forms_whatever_the_approval_mode(
    deployment: Deployment, tmp_path: Path
) -> None:
    # `browser`: the agent's client decides no approval; a tool's questions are not one.
    settings = direct_settings(tmp_path, tmp_path / "effects", LOCKGATE_APPROVAL_MODE="browser")
    server = deployment.start(**settings)
    [key] = server.printed_keys()
    asked: list[str] = []

    async def answer(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        asked.append(params.message)
        field = next(iter(params.requested_schema["properties"]))
        return types.ElicitResult(action="accept", content={field: f"my {field}"})

    async def scenario() -> None:
        async with mcp_client(server.url, key, "legacy", elicitation_callback=answer) as client:
            result = await client.call_tool("test_input_required_result_multi_round", {})
            assert not result.is_error, result
            assert text_of(result) == "my name likes my color."

    run(scenario())
    assert asked == ["Step 1: What is your name?", "Step 2: What is your favorite color?"]


def test_a_client_that_cannot_be_asked_gets_the_questions_and_answers_with_resume(
    deployment: Deployment, tmp_path: Path
) -> None:
    server = deployment.start(**direct_settings(tmp_path, tmp_path / "effects"))
    [key] = server.printed_keys()

    async def scenario() -> None:
        async with mcp_client(server.url, key, "legacy") as client:
            paused = structured(await client.call_tool("test_elicitation", {"message": "Who?"}))
            assert paused["status"] == "waiting_for_interaction", paused
            interaction = paused["interaction"]
            assert interaction["kind"] == "questions"
            assert "approvalUrl" not in interaction  # nothing for the page to approve
            assert interaction["questions"]["response"]["params"]["message"] == "Who?"
            execution_id = paused["executionId"]
            both = await client.call_tool(
                "resume",
                {
                    "executionId": execution_id,
                    "action": "accept",
                    "answers": {"response": {"action": "decline"}},
                },
            )
            assert both.is_error and "not both" in text_of(both)
            unfit = await client.call_tool(
                "resume",
                {
                    "executionId": execution_id,
                    "answers": {"response": {"action": "accept", "content": {"username": 1}}},
                },
            )
            assert unfit.is_error and "does not fit" in text_of(unfit), unfit
            content = {"username": "ada", "email": "ada@example.org"}
            done = await client.call_tool(
                "resume",
                {
                    "executionId": execution_id,
                    "answers": {"response": {"action": "accept", "content": content}},
                },
            )
            finished = structured(done)
            assert finished["status"] == "completed", finished
            assert finished["result"] == (
                'User response: <action: accept, content: {"username": "ada", '
                '"email": "ada@example.org"}>'
            )

    run(scenario())


def _call(client: TasksClient, tool: str, **params: Any) -> Any:
    return client.request("tools/call", {"name": tool, "arguments": {}, **params}, name=tool)


def test_input_required_rounds_go_on_across_a_sigkill_and_refuse_a_tampered_state(
    deployment: Deployment, tmp_path: Path
) -> None:
    settings = direct_settings(tmp_path, tmp_path / "effects")
    server = deployment.start(**settings)
    [key] = server.printed_keys()
    tool = "test_input_required_result_multi_round"
    with httpx2.Client(timeout=30) as http:
        client = TasksClient(http, server.url, key, declare=False)
        first = _call(client, tool)["result"]
        assert first["resultType"] == "input_required", first
        assert list(first["inputRequests"]) == ["step1"]

        server.kill()
        again = deployment.start_at(server.port, **settings)
        client = TasksClient(http, again.url, key, declare=False)
        name = {"step1": {"action": "accept", "content": {"name": "Ada"}}}
        tampered = _call(
            client, tool, inputResponses=name, requestState=first["requestState"][:-4] + "AAAA"
        )
        assert tampered["error"]["code"] == -32602, tampered
        second = _call(client, tool, inputResponses=name, requestState=first["requestState"])
        second = second["result"]
        assert list(second["inputRequests"]) == ["step2"], second
        assert second["requestState"] != first["requestState"]
        colour = {"step2": {"action": "accept", "content": {"color": "teal"}}}
        done = _call(client, tool, inputResponses=colour, requestState=second["requestState"])
        assert done["result"]["content"] == [{"type": "text", "text": "Ada likes teal."}]
        # The same retry again decides nothing twice: the call's own answer, again.
        replay = _call(client, tool, inputResponses=colour, requestState=second["requestState"])
        assert replay["result"]["content"] == done["result"]["content"]


def test_a_task_s_questions_are_answered_one_at_a_time_and_another_key_cannot_reach_them(
    deployment: Deployment, tmp_path: Path
) -> None:
    server = deployment.start(**direct_settings(tmp_path, tmp_path / "effects"))
    [key] = server.printed_keys()
    other = deployment.create_key("bob").secret
    with httpx2.Client(timeout=30) as http:
        client = TasksClient(http, server.url, key)
        task_id = _call(client, "multi_input")["result"]["taskId"]
        waiting = poll(client, task_id, lambda t: t["status"] != "working")
        assert list(waiting["inputRequests"]) == ["name", "confirm"], waiting
        # Another principal's key finds no such task, and answers nothing.
        stranger = TasksClient(http, server.url, other)
        refused = stranger.update(task_id, {"name": {"action": "accept", "content": {}}})
        assert refused["error"]["code"] == -32602, refused
        assert acked(
            client.update(task_id, {"name": {"action": "accept", "content": {"name": "x"}}})
        )
        half = client.get(task_id)["result"]
        assert (half["status"], list(half["inputRequests"])) == ("input_required", ["confirm"])
        unfit = client.update(task_id, {"confirm": {"action": "accept", "content": {"confirm": 3}}})
        assert unfit["error"]["code"] == -32602 and "confirm" in unfit["error"]["message"]
        assert acked(client.update(task_id, {"confirm": {"action": "decline"}}))
        done = poll(client, task_id, lambda t: t["status"] not in ("working", "input_required"))
    assert done["status"] == "completed", done
    assert "Got both: action=accept" in done["result"]["content"][0]["text"]
