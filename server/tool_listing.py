"""What the MCP surface lists: `execute`, `resume`, `describe_tools` and the source tools,
with each tool's signature and the decision its calls meet, as each principal (and its
approval mode) sees them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from lockgate.machine.policy import DECISION_WORDS, Policy, PolicyDecision
from lockgate.machine.tools.admin_source import ADDERS, LIST, REMOVE
from lockgate.machine.tools.registry import ToolRegistry, ToolSpec
from lockgate.machine.tools.tool_details import details
from lockgate.server.surface_tools import (
    Answer,
    ArgumentsRefused,
    Call,
    SurfaceTool,
)


def listed_signature(spec: ToolSpec, decision: PolicyDecision) -> str:
    """`tools.notes.write(key: str, text: str) -> dict  # auto-approved`: the signature with
    what this server's policy does with a call.

    The registry leaves a call that runs at once unannotated; a listing says so in words, so
    an agent never has to infer the policy from a missing note.
    """
    bare, _, notes = spec.signature(decision).partition("  # ")
    words = DECISION_WORDS[decision]
    if decision is PolicyDecision.APPROVE:
        notes = f"{words}; {notes}" if notes else words
    return f"{bare}  # {notes}"


def listing(
    registry: ToolRegistry, policy: Policy, query: str = ""
) -> list[tuple[ToolSpec, PolicyDecision]]:
    """The tools matching `query`, each with the decision the engine will make for its calls
    under the server's configured policy (never the tool's default alone)."""
    return [(spec, policy.decide(spec)) for spec in registry.describe(query)]


def described(
    registry: ToolRegistry, policy: Policy, query: str = ""
) -> tuple[str, dict[str, Any]]:
    """`describe_tools`' answer, as text and as structured content: the tools `query`
    finds (at most `DESCRIBED_TOOLS`), each with its signature, the decision its calls
    meet, its summary and its arguments' fields (`tool_details`); then what the sources
    left out of their documents, so a missing operation is explained rather than absent."""
    matched = listing(registry, policy, query)
    found, more = matched[:DESCRIBED_TOOLS], len(matched) - DESCRIBED_TOOLS
    blocks = []
    for spec, decision in found:
        lines = [listed_signature(spec, decision)]
        lines += [f"    {line}" for line in details(spec)]
        blocks.append("\n".join(lines))
    text = "\n".join(blocks) or "No tool matches."
    if more > 0:
        text += (
            f"\n… and {more} more tools match: add words to the query to narrow "
            "it (they match a tool's name or description)."
        )
    left_out = registry.left_out()
    for source, warnings in left_out.items():
        shown = "; ".join(warnings[:LEFT_OUT_SHOWN])
        rest = len(warnings) - LEFT_OUT_SHOWN
        text += (
            f"\nLeft out of tools.{source} ({len(warnings)} operations its document has but "
            f"that cannot be served): {shown}"
            + (f"; and {rest} more (list_sources names each)" if rest > 0 else "")
        )
    structured: dict[str, Any] = {
        "more": max(more, 0),
        "tools": [
            {
                "name": s.call_name,
                "signature": listed_signature(s, decision),
                "description": s.description,
                "parameters": s.parameters,
                "idempotent": s.idempotent,
                "policy": decision.value,
                "default_policy": s.default_policy.value,
            }
            for s, decision in found
        ],
    }
    if left_out:
        structured["left_out"] = {source: list(w) for source, w in left_out.items()}
    return text, structured


#: How many left-out operations of one source `describe_tools` names (list_sources: all).
LEFT_OUT_SHOWN = 5

#: Up to this many tools, the execute tool's description lists each signature; past it (a
#: large API: hundreds of operations), each source with its count and how to search.
LISTED_TOOLS = 40
#: The most tools one `describe_tools` answer lists; a query narrows a larger match.
DESCRIBED_TOOLS = 50


def execute_description(registry: ToolRegistry, policy: Policy, model_accepts: bool = True) -> str:
    then = (
        "call `resume` with the executionId (and action accept/decline/cancel when the user "
        "decided in chat)."
        if model_accepts
        else "a person approves at the approvalUrl (you cannot accept); then call `resume` "
        "with only the executionId for the result."
    )
    lines = [
        "Run Python code in a sandbox. The code calls tools as tools.<source>.<tool>(...) with "
        "keyword arguments; the value of the last expression is the result and print() "
        "output is returned as logs. Some calls need a person's approval: the answer is then "
        f"`waiting_for_interaction` with an executionId and an approvalUrl; {then} "
        "A declined or blocked call raises PermissionError inside the code.",
    ]
    namespace = registry.namespace()
    count = sum(len(names) for names in namespace.values())
    if count <= LISTED_TOOLS:
        lines[0] += " Available tools, with what this server's policy does with their calls:"
        found = listing(registry, policy)  # the policy's decision for each, only when listed
        lines += [f"- {listed_signature(spec, decision)}" for spec, decision in found]
        return "\n".join(lines)
    lines[0] += (
        f" There are {count} tools, too many to list here: call `describe_tools` with a "
        "query (words of a tool's name or description, e.g. 'create invoice') for their "
        "signatures and what this server's policy does with their calls. The sources:"
    )
    lines += [f"- tools.{source}: {len(names)} tools" for source, names in namespace.items()]
    return "\n".join(lines)


#: The source tools, offered as MCP tools too: a client without code adds its sources.
SOURCE_TOOLS = {spec.name: spec for spec in (*(add for add, _ in ADDERS), LIST, REMOVE)}


def source_tool_code(name: str, arguments: dict[str, Any]) -> str:
    """The code an MCP call of a source tool runs: the same call, from agent code. The
    arguments are JSON values, whose `repr` is a Python literal of the same value."""
    return f"tools.lockgate.{name}(**{arguments!r})"


def source_tool(
    spec: ToolSpec, handle: Callable[[Call, dict[str, Any]], Awaitable[Answer]]
) -> SurfaceTool[dict[str, Any]]:
    """A source tool as an MCP tool: its arguments are checked against its own schema (the
    code would fail on them the same way) before an execution is started for them."""

    def check(arguments: Mapping[str, Any]) -> dict[str, Any]:
        problems = source_tool_problems(spec, dict(arguments))
        if problems:
            raise ArgumentsRefused(problems)
        return dict(arguments)

    return SurfaceTool(
        name=spec.name,
        check=check,
        schema=lambda mode: dict(spec.parameters),
        describe=lambda listed: (
            f"{spec.description} Runs as an execution of "
            f"tools.lockgate.{spec.name}(...): a call that needs approval answers like `execute` "
            "(waiting_for_interaction, then `resume`)."
        ),
        handle=handle,
    )


#: What `resume` says it does, by who may accept.
RESUME_HELP = {
    True: "Continue a paused execution with a decision (accept, decline or cancel), or, "
    "without an action, wait for the result of a running or browser-approved execution. "
    "Works from any session, after restarts and on any instance.",
    False: "A person approves calls on this server (at the approvalUrl, or in your client's "
    "prompt); you cannot accept them. Without an action: wait for the result once they "
    "approved (or see the call still waiting, with its approvalUrl). With decline or cancel: "
    "give the call up yourself. Works from any session, after restarts and on any instance.",
}


#: What `describe_tools` says it does.
DESCRIBE_HELP = (
    "Details of the tools the code can call: arguments, and what this server's policy does "
    "with a call (auto-approved, requires approval, or blocked); `query` filters by words in "
    "their names and descriptions."
)


def source_tool_problems(spec: ToolSpec, arguments: dict[str, Any]) -> str | None:
    """The arguments' problems against the tool's schema, in words, before an execution is
    started for them (the code would fail on them the same way)."""
    from lockgate.machine.tools.arguments import check_arguments
    from lockgate.machine.tools.errors import InvalidArguments

    try:
        check_arguments(spec, dict(arguments), [])
    except InvalidArguments as exc:
        return exc.message
    return None
