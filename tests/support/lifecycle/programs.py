"""The agent code the harness's client runs, and what each program may answer.

A `Program` names its code and its answer for every sequence of decisions a person can record
on its paused calls ("answered" for a call whose tool's questions were all answered), so a
run (or a replay after a crash) can be checked against it. The groups below are what the
drivers choose from: code that runs to its end unasked, code whose calls the policy
approves, code that fails, pauses or asks, and code a drain catches running.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import JsonValue

from lockgate.simulation.canary import LEAKING_CODE
from lockgate.simulation.desk import tag_answer, text_answer
from lockgate.simulation.scenarios import SPIN_CODE, SPIN_ITERATIONS
from lockgate.spec import ExecutionStatus as E

#: An expected result or error code that is not checked.
ANY = object()


@dataclass(frozen=True)
class Outcome:
    status: E
    #: The result the code returns (`ANY`: not checked).
    result: object = ANY
    #: The failure's code (`ANY`: not checked).
    error_code: object = ANY


#: The code raised (an uncaught exception), as opposed to the server failing it.
RAISED = Outcome(E.FAILED, error_code="runtime_error")


@dataclass(frozen=True)
class Program:
    """Agent code and what it answers, keyed by the decisions recorded for its paused calls
    ("accept" or "decline", in call order). A run cut off by a crash may also end interrupted;
    a paused one may also end expired or cancelled."""

    name: str
    code: str
    outcomes: Mapping[tuple[str, ...], Outcome]

    def __repr__(self) -> str:
        return f"Program({self.name})"


def _ends(status: E, result: object = ANY) -> Mapping[tuple[str, ...], Outcome]:
    return {(): Outcome(status, result)}


LIST_ONCE = Program("list_once", "a = tools.notes.list()\nlen(a) >= 0", _ends(E.COMPLETED, True))
LIST_TWICE = Program(
    "list_twice",
    "a = tools.notes.list()\nb = tools.notes.list()\na == b",
    _ends(E.COMPLETED, True),
)
NO_CALLS = Program("no_calls", "x = 20\nx + 22", _ends(E.COMPLETED, 42))
#: Tools that leak their secret into a result, an error and an exception (simulation.canary):
#: the canary invariant holds only because the engine scrubs them.
LEAKY = Program("leaky", LEAKING_CODE, _ends(E.COMPLETED))
RAISES = Program("raises", "raise ValueError('broken')", {(): RAISED})
LIST_THEN_RAISE = Program(
    "list_then_raise", "tools.notes.list()\nraise ValueError('broken')", {(): RAISED}
)
READ_MISSING_CAUGHT = Program(
    "read_missing_caught",
    "try:\n    tools.notes.read(key='missing')\n    r = 'found'\n"
    "except RuntimeError:\n    r = 'caught'\nr",
    _ends(E.COMPLETED, "caught"),
)
READ_MISSING = Program("read_missing", "tools.notes.read(key='missing')", {(): RAISED})
DELETE_BLOCKED = Program(
    "delete_blocked",
    "try:\n    tools.notes.delete(key='k')\n    r = 'deleted'\n"
    "except PermissionError:\n    r = 'blocked'\nr",
    _ends(E.COMPLETED, "blocked"),
)
WRITE_THEN_READ = Program(
    "write_then_read",
    "tools.notes.write(key='k', text='v')\ntools.notes.read(key='k')",
    {
        (): Outcome(E.WAITING_FOR_INTERACTION),
        ("accept",): Outcome(E.COMPLETED, {"key": "k", "text": "v"}),
        ("decline",): RAISED,
    },
)
WRITE_CAUGHT = Program(
    "write_caught",
    "try:\n    tools.notes.write(key='w', text='x')\n    r = 'written'\n"
    "except PermissionError:\n    r = 'refused'\nr",
    {
        (): Outcome(E.WAITING_FOR_INTERACTION),
        ("accept",): Outcome(E.COMPLETED, "written"),
        ("decline",): Outcome(E.COMPLETED, "refused"),
    },
)
TWO_WRITES = Program(
    "two_writes",
    "tools.notes.write(key='a', text='1')\ntools.notes.write(key='b', text='2')\n'both'",
    {
        (): Outcome(E.WAITING_FOR_INTERACTION),
        ("accept",): Outcome(E.WAITING_FOR_INTERACTION),
        ("accept", "accept"): Outcome(E.COMPLETED, "both"),
        ("accept", "decline"): RAISED,
        ("decline",): RAISED,
    },
)

#: A tool that asks its user two things (`simulation.desk`), answered as `ANSWERS` (one at a
#: time or both at once), then writes the note: "answered" is recorded once every question is.
COMPOSE = Program(
    "compose",
    "tools.desk.compose(key='asked')",
    {
        (): Outcome(E.WAITING_FOR_INTERACTION),
        ("answered",): Outcome(E.COMPLETED, {"key": "asked", "text": "v #t"}),
    },
)
ANSWERS: Mapping[str, JsonValue] = {"text": text_answer("v"), "tag": tag_answer("t")}

CALLING_PROGRAMS = (LIST_ONCE, LIST_TWICE)
AUTO_PROGRAMS = (*CALLING_PROGRAMS, NO_CALLS, LEAKY)
FAILING_PROGRAMS = (RAISES, LIST_THEN_RAISE, READ_MISSING)
TOOL_FAILURE_PROGRAMS = (READ_MISSING_CAUGHT, READ_MISSING)
PAUSING_PROGRAMS = (WRITE_THEN_READ, WRITE_CAUGHT, TWO_WRITES)
#: Half a second of pure code after a call: what a drain catches running.
SPIN = Program("spin", SPIN_CODE, _ends(E.COMPLETED, SPIN_ITERATIONS))
PROGRAMS = (*AUTO_PROGRAMS, *FAILING_PROGRAMS, READ_MISSING_CAUGHT, DELETE_BLOCKED,
            *PAUSING_PROGRAMS, SPIN, COMPOSE)  # fmt: skip

PROGRAM_BY_CODE = {p.code: p for p in PROGRAMS}

#: Statuses any execution may end in besides its program's own answer.
ALSO_LEGITIMATE = frozenset({E.EXPIRED, E.CANCELLED, E.INTERRUPTED})
