"""An execution and a journal row as the write path moves them (`RowRecord`), with their
typed rows, and whom an execution runs for."""

from __future__ import annotations

from typing import overload

from lockgate.machine.db.schema import Execution, ToolCall
from lockgate.machine.records import RowRecord

#: An execution and a journal row as the write path moves them, with their typed rows.
ExecutionRecord = RowRecord[Execution]
CallRecord = RowRecord[ToolCall]


@overload
def record_of(row: Execution) -> ExecutionRecord: ...
@overload
def record_of(row: ToolCall) -> CallRecord: ...
def record_of(row: Execution | ToolCall) -> ExecutionRecord | CallRecord:
    if isinstance(row, Execution):
        return RowRecord.of("execution", row)
    return RowRecord.of("tool_call", row)


def principal_of(ex: ExecutionRecord) -> str:
    """The principal an execution runs for: its sandbox steps are shared out by it."""
    return ex.typed.principal_id
