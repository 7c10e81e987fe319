"""Reading a source's document (OpenAPI, JSON or YAML) within bounds a principal cannot
push past: nothing it sends costs the server more than reading its bytes once.

- JSON is read as JSON (C speed), YAML with the C loader where PyYAML has one.
- A document a principal adds (not the operator's) may hold no YAML alias (`*name`): a few
  hundred bytes of aliases expand into gigabytes. They are found by scanning the tokens,
  before anything is built.
- Nesting is bounded (`MAX_DEPTH`, checked without recursion), and a parser's own recursion
  limit is a refusal in words, never an internal error.
- The size of what a principal adds is bounded by `LOCKGATE_MAX_CALL_ARGUMENT_BYTES` (inline,
  from code), the request body limit (an MCP tool's argument) or
  `LOCKGATE_MAX_SOURCE_DOCUMENT_BYTES` (by URL).
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from lockgate.machine.tools.errors import InvalidToolSource

#: The deepest nesting of objects and arrays a document may have (real APIs stay well
#: under 40; a schema nested thousands deep only exhausts parsers).
MAX_DEPTH = 128
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_document(text: str, *, name: str, trusted: bool) -> Any:
    """The parsed document, or `InvalidToolSource` in words. `trusted`: the operator's (YAML
    aliases allowed)."""
    try:
        document = _parsed(text, name, trusted)
    except RecursionError:
        raise InvalidToolSource(
            f"source {name!r}: its document is nested too deep to read",
            hint=f"A document may nest objects and arrays {MAX_DEPTH} levels deep at most.",
        ) from None
    depth = deepest(document)
    if depth > MAX_DEPTH:
        raise InvalidToolSource(
            f"source {name!r}: its document nests {depth} levels deep, more than {MAX_DEPTH}",
            hint="Flatten it (a schema can refer to a component with $ref).",
        )
    return document


def _parsed(text: str, name: str, trusted: bool) -> Any:
    if text.lstrip().startswith(("{", "[")):
        try:
            return json.loads(text)
        except ValueError:
            pass  # YAML's flow style also starts so
    if not trusted:
        try:
            for token in yaml.scan(text, Loader=_LOADER):
                if isinstance(token, yaml.AliasToken):
                    raise InvalidToolSource(
                        f"source {name!r}: its document uses YAML aliases (*name), which a "
                        "source added by a principal may not: a few of them expand into "
                        "gigabytes",
                        hint="Give the document as JSON, or as YAML without anchors' aliases.",
                    )
        except yaml.YAMLError as exc:
            raise _unreadable(name, exc) from None
    try:
        return yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        raise _unreadable(name, exc) from None


def _unreadable(name: str, exc: Exception) -> InvalidToolSource:
    return InvalidToolSource(
        f"source {name!r}: its document is neither JSON nor YAML ({type(exc).__name__})"
    )


def deepest(document: Any) -> int:
    """How deep objects and arrays nest in `document` (iteratively: any depth is measured)."""
    deepest_seen = 0
    todo: list[tuple[Any, int]] = [(document, 1)]
    while todo:
        node, depth = todo.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest_seen = max(deepest_seen, depth)
        if depth > MAX_DEPTH:
            return depth  # enough to refuse it: no need to walk the rest
        todo.extend((child, depth + 1) for child in children)
    return deepest_seen
