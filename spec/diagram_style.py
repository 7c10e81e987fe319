"""What every lifecycle diagram shares: the symbols, colours and wording of states and edges.

The DOT drawing, the Mermaid drawing, the legend and the README tables all say the same
things about a state or an edge; they take the words from here so that the SVG, the Mermaid
diagram and the README can never disagree about what an edge is labelled or what a kind of
state is called.

Two drawing rules live here because every drawing applies them:

- a transition declared from several source states is drawn once: an unlabelled line from
  each source into a small junction (a diamond; a Mermaid `<<choice>>` state), and one
  labelled arrow from it to the destination (`merge_id` names the junction);
- an edge is labelled with its crash points only when they differ from the `bc ac` of every
  ordinary durable write (`crash_label`): an edge with an external effect, where the point
  after the effect is what recovery is about, or one not written durably. The README's
  per-machine table lists every crash point, creation points included.
"""

from __future__ import annotations

from collections.abc import Mapping

from lockgate.spec.crash_points import phases
from lockgate.spec.model import Otherwise, Phase, StateSpec, TransitionKind, TransitionSpec

#: The command that regenerates the diagrams folder; every generated file and drift message
#: names it.
COMMAND = "lockgate diagrams"

#: The name of the legend's files (`legend.dot`, `legend.svg`); no machine may take it.
LEGEND_NAME = "legend"

# Symbols shared by the DOT and Mermaid labels (each is a Unicode emoji, safe in Mermaid).
RECOVERY = "\u26a1"  # ⚡ an edge fired only by recovery
CRASH = "\u2716"  # ✖ the crash points of an edge
EXTERNAL = "\u2197"  # ↗ an external effect (a call to the world outside the database)
APPROVAL = "\u2714"  # ✔ the edge uses up a person's decision
MERGE = "\u25c6"  # ◆ (README and legend only) where one transition's edges from several states meet

PHASE_ABBREVIATIONS: Mapping[Phase, str] = {
    "before_commit": "bc",
    "after_commit": "ac",
    "after_effect": "ae",
}

#: The crash phases of every ordinary durable write. An edge with exactly these is drawn with
#: no crash label: saying `bc ac` on every edge says nothing.
ORDINARY_PHASES: tuple[Phase, ...] = ("before_commit", "after_commit")

COLORS: Mapping[str, str] = {
    "owned_fill": "#fde2c4",
    "owned_line": "#c2410c",
    "wait_fill": "#dbeafe",
    "wait_line": "#1d4ed8",
    "terminal_fill": "#e5e7eb",
    "terminal_line": "#374151",
    "normal": "#1f2937",
    "recovery": "#dc2626",
    "approval": "#15803d",
    "text": "#111827",
}


def state_kind(state: StateSpec) -> str:
    """`terminal`, `owned` or `durable wait` (every non-terminal state is one of the last two)."""
    if state.terminal:
        return "terminal"
    if state.owned:
        return "owned"
    return "durable wait"


def state_kinds(state: StateSpec) -> str:
    """The kind as the README's table shows it, `initial` first when it is the initial state."""
    kind = state_kind(state)
    return f"initial, {kind}" if state.initial else kind


def crash_summary(state: StateSpec) -> str:
    """What a crash does to a state, in a few words (`requeue, interrupt`, `durable wait`)."""
    on_crash = state.on_crash
    if on_crash is None:
        return ""
    parts = list(on_crash.events)
    if on_crash.otherwise is not None:
        otherwise = "durable wait" if on_crash.otherwise is Otherwise.DURABLE_WAIT else "reclaim"
        parts.append(f"else {otherwise}" if parts else otherwise)
    return ", ".join(parts)


def guard_text(t: TransitionSpec, sep: str) -> str:
    """`[g, !h]`: conditions as `g`, unless as `!g`; empty when the edge has no guard."""
    guards = [*t.conditions, *(f"!{g}" for g in t.unless)]
    return f"[{sep.join(guards)}]" if guards else ""


def crash_marker(t: TransitionSpec) -> str:
    """`✖ bc ac ae`, the crash phases of an edge in the order the write path passes them."""
    marks = [PHASE_ABBREVIATIONS[p] for p in phases(t)]
    return " ".join([CRASH, *marks]) if marks else ""


def crash_points_notable(t: TransitionSpec) -> bool:
    """Whether a diagram labels this edge with its crash points: only when they differ from
    `ORDINARY_PHASES`, i.e. it has an external effect (the point after the effect, and where
    it falls relative to the commit, is what recovery is about) or it is not written durably.
    """
    return phases(t) != ORDINARY_PHASES


def crash_label(t: TransitionSpec) -> str:
    """The crash marker a diagram draws on an edge: `✖ bc ac ae` (or `✖ ae bc ac`) on an edge
    with an external effect, `✖ none` on one not written durably, nothing on any other."""
    if not crash_points_notable(t):
        return ""
    return crash_marker(t) or f"{CRASH} none"


def merge_id(index: int, t: TransitionSpec) -> str:
    """The id of the junction where the edges of `t`, the machine's transition number
    `index`, meet when it has several sources (unique: two transitions may share an event)."""
    return f"merge_{index}_{t.event}"


def timing_text(t: TransitionSpec) -> str:
    if t.external_effect is None:
        return ""
    return t.external_effect.timing.value.replace("_", " ")


def event_text(t: TransitionSpec, sep: str) -> str:
    """`⚡ event [g, !h]`: the first words of an edge's label in every drawing, the recovery
    mark first so that Mermaid, which draws every edge alike, still shows it."""
    prefix = f"{RECOVERY} " if t.kind is TransitionKind.RECOVERY else ""
    guards = guard_text(t, sep)
    return f"{prefix}{t.event} {guards}" if guards else f"{prefix}{t.event}"
