"""The one decision entry: every door through which a gated call is decided comes here (and
answers to what a tool asked its user, which every door also carries: `answer`).

A door only translates its protocol into a `Decision` and says who is deciding (`Who`):

- `Agent`: the principal's own credential, the MCP `resume` tool or the HTTP API with its
  key. An agent may decline or cancel its own call in every mode; it accepts only in
  approval mode `model`, the operator's explicit choice.
- `ClientPrompt`: the client's own prompt to its person (elicitation, `input_required`, a
  task's input), in mode `native`. It is trusted as the client's user interface: the server
  cannot tell a person's click there from the client's own code, and says so in the
  security model. In mode `browser` it decides nothing but a decline or a cancel.
- `Person`: a signed-in approver (OpenID Connect or a passkey), through the page or the
  inbox, for the principals they were granted; the decision names the digest of the call
  exactly as they were shown it (`server/call_shown.py`).

Here, once for every door: who may decide what, the grant a decision carries, the digest,
and the audit record's `Decider`. Then the engine applies the decision in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from anyio import to_thread
from pydantic import JsonValue

from lockgate.machine.approval_audit import Decider, Door
from lockgate.machine.approval_grants import grant_of
from lockgate.machine.approval_modes import ApprovalMode, accept_refused
from lockgate.machine.engine import Action
from lockgate.machine.errors import ErrorCode, LockgateError
from lockgate.machine.execution_errors import ExecutionNotFound
from lockgate.machine.people import People, SignedIn
from lockgate.machine.views import ExecutionView
from lockgate.server.call_shown import call_shown
from lockgate.server.runner import ExecutionRunner
from lockgate.server.shapes import Running


class NotYours(LockgateError):
    """A person tried to decide a call of a principal they do not approve for."""

    code = ErrorCode.FORBIDDEN


class ShownOutdated(LockgateError):
    """The decision names another call than the one stored (changed, or never shown)."""

    code = ErrorCode.ALREADY_SETTLED


class DecisionRefused(LockgateError):
    code = ErrorCode.INVALID_INPUT


class CallNotFound(LockgateError):
    code = ErrorCode.NOT_FOUND


@dataclass(frozen=True)
class Agent:
    principal: str
    door: Door
    #: The approval mode of the connection (the principal's, or stricter).
    mode: ApprovalMode
    client: dict[str, JsonValue] | None = None


@dataclass(frozen=True)
class ClientPrompt:
    principal: str
    door: Door
    mode: ApprovalMode
    client: dict[str, JsonValue] | None = None


@dataclass(frozen=True)
class Person:
    signed_in: SignedIn
    door: Door


Who = Agent | ClientPrompt | Person


@dataclass(frozen=True)
class Decision:
    execution_id: str
    action: Action
    #: The call decided: only it, never a later one (None: whichever the execution waits on).
    call: int | None = None
    #: What comes with an accept (a grant: `machine/approval_grants.py`).
    content: JsonValue = None
    #: The digest of the call as the person was shown it.
    shown: str | None = None


@dataclass(frozen=True)
class Answers:
    execution_id: str
    #: By question key, each an MCP `ElicitResult` (`action`, `content`).
    responses: dict[str, JsonValue]
    #: The call asked: only it, never a later one (None: whichever the execution waits on).
    call: int | None = None


class Decisions:
    def __init__(
        self,
        runner: ExecutionRunner,
        people: People,
        approval_url: Callable[[ExecutionView], str | None],
    ) -> None:
        self.runner, self.people, self.approval_url = runner, people, approval_url

    async def decide(self, who: Who, decision: Decision) -> ExecutionView | Running:
        """Apply `decision` as `who`, or raise why not (a `LockgateError`, in words)."""
        principal = await to_thread.run_sync(self._principal, who, decision)
        await self._may(who, decision, principal)
        if decision.action is Action.ACCEPT:
            # A grant that cannot be read is refused before anything is decided.
            grant_of(decision.content, self.runner.runtime.settings.max_calls)
        return await self.runner.resume(
            principal,
            decision.execution_id,
            decision.action,
            decision.content if decision.action is Action.ACCEPT else None,
            expected_call=decision.call,
            decided_by=self._decider(who),
        )

    async def answer(
        self, who: Agent | ClientPrompt, answers: Answers, budget: float | None = None
    ) -> ExecutionView | Running:
        """Apply answers to what a paused call's tool asked its user. Not a decision: no mode
        restricts them and no person's identity is checked (a question is the tool's own
        interface to its user, who answers through the client); only the principal's own
        executions are reached (the engine refuses any other's)."""
        return await self.runner.answer(
            who.principal,
            answers.execution_id,
            answers.responses,
            expected_call=answers.call,
            budget=budget,
        )

    def _principal(self, who: Who, decision: Decision) -> str:
        """Whose execution this is: the caller's own (the engine refuses anyone else's), or,
        for a person, the execution's principal once the person may decide for it."""
        if not isinstance(who, Person):
            return who.principal
        store = self.runner.runtime.engine.store
        row = store.executions.get(decision.execution_id)
        if row is None:
            raise ExecutionNotFound(execution_id=decision.execution_id)
        approver = who.signed_in.approver
        if not self.people.may_decide(approver.id, row.principal_id):
            raise NotYours(
                f"{approver.name} does not approve calls of {row.principal_id}.",
                hint="The operator grants that: lockgate approvers add ... --principal "
                f"{row.principal_id}.",
            )
        if decision.action is Action.CANCEL:
            raise DecisionRefused(
                "A person accepts or declines a call; cancelling the execution is its agent's "
                "to do."
            )
        if decision.call is None:
            raise DecisionRefused("A person's decision names the call it is for.")
        shown = call_shown(store, decision.execution_id, decision.call)
        if shown is None:
            raise CallNotFound(
                f"Execution {decision.execution_id} has no call {decision.call}.",
                hint="Decide the call its page shows (the inbox lists what waits).",
            )
        must_match = decision.action is Action.ACCEPT or decision.shown is not None
        if shown.waiting and must_match and decision.shown != shown.digest:
            raise ShownOutdated(
                "This decision is not for the call as it waits now (what was shown differs "
                "from what would run).",
                hint="Reload the page and decide on what it shows.",
            )
        return row.principal_id

    async def _may(self, who: Who, decision: Decision, principal: str) -> None:
        """An accept needs a person, or the operator's leave for the model (mode `model`),
        or, in mode `native`, the client's prompt. Giving up needs nobody's leave."""
        if decision.action is not Action.ACCEPT or isinstance(who, Person):
            return
        if who.mode is ApprovalMode.MODEL:
            return
        if isinstance(who, ClientPrompt) and who.mode is ApprovalMode.NATIVE:
            return
        engine = self.runner.runtime.engine
        view = await to_thread.run_sync(engine.get, decision.execution_id, principal)
        if view.pending is None:
            return  # nothing waits: the engine answers what became of it
        raise accept_refused(who.mode, self.approval_url(view))

    @staticmethod
    def _decider(who: Who) -> Decider:
        """Who decided, as the audit record names them."""
        if isinstance(who, Person):
            person = who.signed_in.person
            return Decider(who.door, person.name, person=person)
        if isinstance(who, ClientPrompt):
            return Decider(who.door, f"the person at {who.principal}'s client", who.client)
        return Decider(who.door, f"the model ({who.principal}'s key)", who.client)
