"""One tool call as the write path makes it: its secrets resolved at that moment, what it
returns or raises scrubbed of them and bounded, and its outcome for the journal.

A tool's own failure (`ToolFailed`) is an outcome like a value: the code sees it raised. A
call whose answer was lost after it was sent (`ToolOutcomeUnknown`) is one only when the tool
may be called again (idempotent): then it fails like any other. Otherwise it is raised on, to
the driver, which leaves the call in doubt exactly as recovery does after a crash.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import JsonValue

from lockgate.machine import tracing
from lockgate.machine.secrets import MissingSecret, Redactor, SecretStore
from lockgate.machine.tools.call_notices import (
    CallNotice,
    Listener,
    LogNotice,
    ProgressNotice,
    StreamRelease,
    nobody,
)
from lockgate.machine.tools.questions import InputNeeded
from lockgate.machine.tools.registry import Tool, ToolContext, ToolFailed, ToolOutcomeUnknown
from lockgate.machine.values import limit_size, to_json

log = logging.getLogger("lockgate.engine")
#: How a tool's failure begins when it raised something other than `ToolFailed`: a fault of
#: the tool, not an answer (a direct call's task says `failed`, a JSON-RPC internal error).
UNEXPECTED = "the tool failed unexpectedly"


@dataclass(frozen=True)
class Dispatched:
    """What a tool call produced: a value for the code, or an error message for it."""

    value: JsonValue = None
    error: str | None = None
    #: The questions the tool asked its user instead of answering (`ToolContext.ask`),
    #: scrubbed of its secrets; None when it answered.
    asked: dict[str, JsonValue] | None = None
    before_task: bool = False


def invoke(
    tool: Tool,
    arguments: dict[str, JsonValue],
    *,
    call_id: str,
    principal: str,
    secrets: SecretStore,
    notify: Listener = nobody,
    answers: Mapping[str, JsonValue] | None = None,
    max_result_bytes: int,
) -> Dispatched:
    """Run the tool with its secrets resolved now; nothing it returns or raises is kept
    before every secret value is scrubbed from it. `ToolOutcomeUnknown` (its message
    scrubbed) when a call that must not be repeated was sent and its answer lost."""
    owned = tool.spec.owner is not None
    try:  # a source the principal added itself reads only that principal's secrets
        resolved = secrets.resolve(
            tool.spec.secrets, principal=principal, source=tool.spec.source, own_only=owned
        )
    except MissingSecret as exc:  # a principal's own source: say how it gets one
        return Dispatched(error=f"{exc.message}. {exc.hint}" if owned else exc.message)
    redactor = Redactor(resolved.values())
    context = ToolContext(
        idempotency_key=call_id,
        secrets=resolved,
        principal_id=principal,
        # What the tool says is scrubbed of its secrets like its answer.
        notify=lambda notice: notify(_scrubbed(notice, redactor)),
        answers=answers or {},
    )
    try:
        with tracing.span(
            "lockgate.tool_call",
            attributes=tracing.attributes_of(call_id=call_id, tool=tool.spec.full_name),
        ):
            value = tool.call(arguments, context)
    except InputNeeded as asked:
        if not tool.spec.asks:  # made at once, where a question could not pause it
            log.warning("tool %s asked without declaring asks=True", tool.spec.full_name)
            return Dispatched(error=f"{UNEXPECTED} (it asked for input it does not declare)")
        questions = redactor.redact(to_json(asked.asked))
        assert isinstance(questions, dict)
        return Dispatched(asked=questions, before_task=asked.before_task)
    except ToolOutcomeUnknown as exc:
        if tool.spec.idempotent:  # nothing to doubt: a read that failed
            return Dispatched(error=redactor.redact_text(exc.failure))
        raise ToolOutcomeUnknown(redactor.redact_text(exc.message)) from None
    except ToolFailed as exc:
        return Dispatched(error=redactor.redact_text(str(exc)))
    except Exception as exc:
        log.warning(
            "tool %s raised %s", tool.spec.full_name, type(exc).__name__
        )  # the message may hold a secret: the type is enough for operators
        return Dispatched(error=f"{UNEXPECTED} ({type(exc).__name__})")
    clean = redactor.redact(to_json(value))
    return Dispatched(value=limit_size(clean, max_result_bytes))


def _scrubbed(notice: CallNotice, redactor: Redactor) -> CallNotice:
    if isinstance(notice, StreamRelease):
        return notice  # says nothing
    if isinstance(notice, LogNotice):
        return LogNotice(notice.level, redactor.redact(to_json(notice.data)))
    message = redactor.redact_text(notice.message) if notice.message is not None else None
    return ProgressNotice(notice.progress, notice.total, message)
