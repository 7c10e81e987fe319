"""The `$ref`s of one OpenAPI document, resolved against the whole document.

OpenAPI lets a `$ref` be any JSON pointer into the document: a component
(`#/components/schemas/Pet`), but also another operation's parameter
(`#/paths/~1pets/get/parameters/0`) or a schema deep inside a response, with JSON-pointer
escapes (`~1` for `/`, `~0` for `~`) and percent-encoding (`%7Bid%7D` for `{id}`), read in
that order as `referencing` reads them (percent-decoding first, then the segments).

A tool's parameters schema is checked at each call by `jsonschema`, which resolves its
`$ref`s against the tool's own schema: each tool carries the parts of the document its schema
refers to, directly or through one another, at the places they have in the document (a
sparse copy: objects hold only the keys needed, arrays are padded with nulls). Each part is
checked as a JSON Schema once per document, and the parts a part refers to are found once
per document too, so a document of thousands of operations sharing large schemas (Microsoft
Graph's) costs each of them once, not once per operation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import pairwise
from typing import Any
from urllib.parse import unquote

#: `$ref`s followed in a row before a chain is taken for a cycle.
MAX_REF_HOPS = 32
#: The keys of a tool's own parameters schema: a part of the document at one of these
#: places could not be carried beside them.
OWN_KEYS = frozenset({"type", "properties", "required", "additionalProperties", "$schema"})

Pointer = tuple[str | int, ...]


class BadReference(ValueError):
    """A `$ref` that cannot be followed, in words."""


def refs_in(node: Any) -> list[str]:
    """Every `$ref` string in `node`, at any depth (iteratively: any depth is walked)."""
    found: list[str] = []
    todo = [node]
    while todo:
        item = todo.pop()
        if isinstance(item, Mapping):
            ref = item.get("$ref")
            if isinstance(ref, str):
                found.append(ref)
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return found


def _shown(pointer: Pointer) -> str:
    if not pointer:
        return "# (the document's root)"
    return "#/" + "/".join(str(s).replace("~", "~0").replace("/", "~1") for s in pointer)


class DocumentRefs:
    """`$ref`s into `document` (already in JSON Schema's dialect where it needs to be)."""

    def __init__(
        self,
        document: Mapping[str, Any],
        prepare: Callable[[Any], Any] | None = None,
        check: Callable[[Any, str], None] | None = None,
    ) -> None:
        """`prepare(part)`: a part as it is used (OpenAPI 3.0's schemas turned into JSON
        Schema), made once for each part used, never for the document whole (most of a large
        one, its responses, is never used); `check(schema, where)` raises ValueError for a
        part that is not a valid schema."""
        self._document = document
        self._prepare = prepare
        self._check = check
        self._parts: dict[Pointer, Any] = {}
        self._pointers: dict[str, Pointer] = {}
        self._closures: dict[Pointer, frozenset[Pointer]] = {}
        self._direct: dict[Pointer, tuple[Pointer, ...]] = {}
        self._checked: dict[Pointer, str | None] = {}

    def pointer(self, ref: str) -> Pointer:
        """Where `ref` points in the document, its segments decoded (keys as text, array
        indexes as numbers); BadReference in words where it points to nothing."""
        known = self._pointers.get(ref)
        if known is not None:
            return known
        if not ref.startswith("#"):
            raise BadReference(
                f"its $ref {ref!r} points outside the document (only '#/...' pointers are "
                "followed: bundle the document first)"
            )
        text = unquote(ref[1:])
        if text and not text.startswith("/"):
            raise BadReference(f"its $ref {ref!r} is not a JSON pointer ('#/...')")
        node: Any = self._document
        segments: list[str | int] = []
        for raw in text.split("/")[1:] if text else []:
            if isinstance(node, list):
                if not raw.isdigit() or int(raw) >= len(node):
                    raise BadReference(
                        f"its $ref {ref!r} points to nothing in the document (no item {raw!r} "
                        f"in the list at {_shown(tuple(segments))})"
                    )
                index = int(raw)
                node = node[index]
                segment: str | int = index
            elif isinstance(node, Mapping):
                segment = raw.replace("~1", "/").replace("~0", "~")
                if segment not in node:
                    raise BadReference(
                        f"its $ref {ref!r} points to nothing in the document (no {segment!r} "
                        f"at {_shown(tuple(segments))})"
                    )
                node = node[segment]
            else:
                raise BadReference(
                    f"its $ref {ref!r} points to nothing in the document "
                    f"({_shown(tuple(segments))} is a {type(node).__name__})"
                )
            segments.append(segment)
        found = tuple(segments)
        self._pointers[ref] = found
        return found

    def at(self, pointer: Pointer) -> Any:
        node: Any = self._document
        for segment in pointer:
            node = node[segment]
        return node

    def part(self, pointer: Pointer) -> Any:
        """What `pointer` points to, prepared."""
        if pointer not in self._parts:
            found = self.at(pointer)
            self._parts[pointer] = found if self._prepare is None else self._prepare(found)
        return self._parts[pointer]

    def lookup(self, ref: str) -> Any:
        return self.part(self.pointer(ref))

    def follow(self, item: Any) -> Any:
        """`item`, or what its `$ref` (and theirs, in a row) points to: a parameter, a
        request body, a media type's schema."""
        for _ in range(MAX_REF_HOPS):
            if not (isinstance(item, Mapping) and isinstance(item.get("$ref"), str)):
                return item
            item = self.lookup(item["$ref"])
        raise BadReference(f"it has more than {MAX_REF_HOPS} $refs in a row (a cycle?)")

    def _closure(self, start: Pointer) -> frozenset[Pointer]:
        """`start` and every part it refers to, directly or through one another."""
        known = self._closures.get(start)
        if known is not None:
            return known
        seen = {start}
        todo = [start]
        while todo:
            here = todo.pop()
            direct = self._direct.get(here)
            if direct is None:
                direct = tuple(dict.fromkeys(self.pointer(ref) for ref in refs_in(self.at(here))))
                self._direct[here] = direct
            for there in direct:
                if there not in seen:
                    seen.add(there)
                    todo.append(there)
        closure = frozenset(seen)
        self._closures[start] = closure
        return closure

    def _checked_part(self, pointer: Pointer) -> None:
        if self._check is None:
            return
        if pointer not in self._checked:
            try:
                self._check(self.part(pointer), f"the schema at {_shown(pointer)}")
                self._checked[pointer] = None
            except ValueError as exc:
                self._checked[pointer] = str(exc)
        problem = self._checked[pointer]
        if problem is not None:
            raise BadReference(problem)

    def carried(self, schema: Any) -> dict[str, Any]:
        """The parts of the document `schema` refers to, at their places (a sparse copy of
        the document), each checked as a JSON Schema."""
        wanted: set[Pointer] = set()
        for ref in refs_in(schema):
            wanted |= self._closure(self.pointer(ref))
        out: dict[str, Any] = {}
        placed: set[Pointer] = set()
        for pointer in sorted(wanted, key=len):
            if any(pointer[:n] in placed for n in range(1, len(pointer))):
                continue  # inside a part already carried whole
            if not pointer or pointer[0] in OWN_KEYS:
                raise BadReference(
                    f"its schema refers to {_shown(pointer)}, a place a tool's own schema "
                    "cannot hold beside its arguments"
                )
            self._checked_part(pointer)
            _place(out, pointer, self.part(pointer))
            placed.add(pointer)
        return out


def _place(root: dict[str, Any], pointer: Pointer, value: Any) -> None:
    """`value` put at `pointer` in the sparse copy `root`, making the objects and arrays on
    the way (arrays padded with nulls)."""
    node: Any = root
    for segment, after in pairwise(pointer):
        child = _get(node, segment)
        if child is None:
            child = [] if isinstance(after, int) else {}
            _set(node, segment, child)
        node = child
    _set(node, pointer[-1], value)


def _get(node: dict[str, Any] | list[Any], segment: str | int) -> Any:
    if isinstance(node, list):
        assert isinstance(segment, int)
        return node[segment] if segment < len(node) else None
    return node.get(str(segment))


def _set(node: dict[str, Any] | list[Any], segment: str | int, value: Any) -> None:
    if isinstance(node, list):
        assert isinstance(segment, int)
        node.extend([None] * (segment + 1 - len(node)))
        node[segment] = value
    else:
        node[str(segment)] = value
