"""Who may accept a gated call: the approval mode of a principal's connection.

- `model`: the agent accepts with `resume {action: "accept"}`. For clients that ask their
  user before every tool call themselves; the gate is then the client's.
- `native`: the client asks the person (MCP elicitation, where the client declares it); the
  approval page stays available. The model cannot accept.
- `browser`: only the approval page accepts. The model cannot accept.

In every mode the model may decline or cancel its own call: giving up needs nobody's leave.

The mode is the server's `LOCKGATE_APPROVAL_MODE`, overridden per principal by
`LOCKGATE_APPROVAL_MODES` (`ci=model,alice=browser`: the operator's word, which may loosen
or tighten), and a connection may ask for a stricter one with `?approval=<mode>` on the MCP
URL, never a looser one: a client cannot talk its way out of the gate.
"""

from __future__ import annotations

from enum import StrEnum

from lockgate.machine.errors import ErrorCode, LockgateError


class ApprovalMode(StrEnum):
    MODEL = "model"
    NATIVE = "native"
    BROWSER = "browser"


#: From the loosest to the strictest: `native` trusts the client's own prompt to a person,
#: `browser` only the page.
STRICTNESS = (ApprovalMode.MODEL, ApprovalMode.NATIVE, ApprovalMode.BROWSER)
#: The query parameter on the MCP URL a connection asks for a stricter mode with.
QUERY_PARAMETER = "approval"


def stricter(a: ApprovalMode, b: ApprovalMode) -> ApprovalMode:
    return max(a, b, key=STRICTNESS.index)


class InvalidApprovalMode(LockgateError):
    code = ErrorCode.INVALID_INPUT


class AcceptNeedsAPerson(LockgateError):
    """The model tried to accept its own call where a person must."""

    code = ErrorCode.FORBIDDEN


def parse_mode(text: str, where: str) -> ApprovalMode:
    try:
        return ApprovalMode(text.strip().lower())
    except ValueError:
        raise InvalidApprovalMode(
            f"{where}: unknown approval mode {text!r}",
            hint="Use model, native or browser.",
        ) from None


def parse_modes(text: str) -> dict[str, ApprovalMode]:
    """`LOCKGATE_APPROVAL_MODES`: `principal=mode` pairs, comma-separated."""
    modes: dict[str, ApprovalMode] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        principal, sep, mode = part.partition("=")
        if not sep or not principal.strip():
            raise InvalidApprovalMode(
                f"LOCKGATE_APPROVAL_MODES: {part!r} is not principal=mode",
                hint="For example: ci=model,alice=browser.",
            )
        modes[principal.strip()] = parse_mode(mode, f"LOCKGATE_APPROVAL_MODES ({principal})")
    return modes


class ApprovalModes:
    def __init__(self, default: ApprovalMode, per_principal: dict[str, ApprovalMode]) -> None:
        self.default, self.per_principal = default, per_principal

    @classmethod
    def from_text(cls, default: str, per_principal: str) -> ApprovalModes:
        return cls(parse_mode(default, "LOCKGATE_APPROVAL_MODE"), parse_modes(per_principal))

    def for_principal(self, principal: str) -> ApprovalMode:
        return self.per_principal.get(principal, self.default)

    def for_connection(self, principal: str, asked: str | None) -> ApprovalMode:
        """The principal's mode, or the stricter one its connection asked for."""
        mode = self.for_principal(principal)
        if asked is None:
            return mode
        return stricter(mode, parse_mode(asked, f"?{QUERY_PARAMETER}= on the MCP URL"))


def accept_refused(mode: ApprovalMode, approval_url: str | None) -> AcceptNeedsAPerson:
    """The error for an accept the model sent in `mode` (not `model`)."""
    where = f"at {approval_url}" if approval_url else "at the approval page"
    also = " or in your client's prompt" if mode is ApprovalMode.NATIVE else ""
    return AcceptNeedsAPerson(
        f"A person must approve this call (approval mode {mode.value}): you cannot accept it.",
        hint=f"Ask the user to approve it {where}{also}, then call resume with only the "
        "executionId to get the result. You may decline or cancel it yourself.",
    )
