"""The tools built from an OpenAPI document, kept on disk under the document's digest, so a
restart serves a large API (GitHub's: 13 MB, 1,223 operations, seconds to check) from what
it built before instead of parsing and checking the document again.

A catalogue is what the document alone decides: each operation's tool (name, summary,
parameters' schema, policy defaults), how a call is sent (method, path, where each argument
goes, how the body is encoded), the document's server URL and what was left out. What the
operator's table adds (the source's name, its base URL, its auth) is applied when it is
served, so one catalogue serves any table naming the same document.

The key is the digest of the document's text and of the code that builds catalogues (a new
Lockgate builds again rather than trust an old shape). Files are JSON, never pickles, written
whole to a temporary name and renamed, so a crash leaves either the old file or the new one;
a file that cannot be read is ignored and built again. Only the operator's sources are kept
(a principal's documents are small, bounded, and not the operator's to store on disk), and
at most `KEPT` catalogues, the least recently used leaving first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from lockgate.machine.tools.form_bodies import BodyEncoding
from lockgate.machine.tools.openapi_operations import LeftOut

log = logging.getLogger("lockgate.sources")

#: The most catalogues kept in one folder.
KEPT = 32
#: The modules whose code decides what a catalogue holds.
_BUILDERS = (
    "openapi.py",
    "openapi_catalogue.py",
    "openapi_operations.py",
    "openapi_refs.py",
    "form_bodies.py",
    "schema.py",
    "schema_check.py",
    "ecma_patterns.py",
    "spec.py",
)


@cache
def _builder_digest() -> str:
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for name in _BUILDERS:
        path = here / name
        digest.update(path.read_bytes() if path.exists() else name.encode())
    return digest.hexdigest()


def catalogue_key(text: str) -> str:
    """The key a document's catalogue is kept under: its text's digest and the builder's."""
    digest = hashlib.sha256(_builder_digest().encode())
    digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


@dataclass(frozen=True)
class CataloguedOperation:
    #: The tool's `ToolSpec` fields that the document decides (not source, secrets, owner).
    spec: dict[str, Any]
    method: str
    path: str
    #: (argument, the API's name, where it goes) for each parameter.
    parameters: tuple[tuple[str, str, str], ...]
    body: str | None
    encoding: BodyEncoding

    def as_json(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "method": self.method,
            "path": self.path,
            "parameters": [list(p) for p in self.parameters],
            "body": self.body,
            "encoding": {
                "media": self.encoding.media,
                "deep": sorted(self.encoding.deep),
                "files": sorted(self.encoding.files),
            },
        }

    @classmethod
    def from_json(cls, found: dict[str, Any]) -> CataloguedOperation:
        encoding = found["encoding"]
        return cls(
            spec=dict(found["spec"]),
            method=str(found["method"]),
            path=str(found["path"]),
            parameters=tuple((str(a), str(n), str(w)) for a, n, w in found["parameters"]),
            body=None if found["body"] is None else str(found["body"]),
            encoding=BodyEncoding(
                str(encoding["media"]),
                frozenset(map(str, encoding["deep"])),
                frozenset(map(str, encoding["files"])),
            ),
        )


@dataclass(frozen=True)
class Catalogue:
    operations: tuple[CataloguedOperation, ...]
    #: The document's first server URL, as written (relative ones resolve when served).
    server_url: str | None
    #: The operations left out, with why (`OpenApiSource.left_out` names them).
    left_out: tuple[LeftOut, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "server_url": self.server_url,
            "left_out": [[o.method, o.path, o.tool, o.why] for o in self.left_out],
            "operations": [operation.as_json() for operation in self.operations],
        }

    @classmethod
    def from_json(cls, found: dict[str, Any]) -> Catalogue:
        server = found["server_url"]
        return cls(
            operations=tuple(CataloguedOperation.from_json(o) for o in found["operations"]),
            server_url=None if server is None else str(server),
            left_out=tuple(LeftOut(*map(str, o)) for o in found["left_out"]),
        )


class CatalogueShelf:
    """The folder catalogues are kept in (`LOCKGATE_CATALOGUE_DIR`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def get(self, key: str) -> Catalogue | None:
        """The catalogue kept under `key`, or None (none kept, or one that cannot be read)."""
        path = self.folder / f"{key}.json"
        try:
            found = json.loads(path.read_bytes())
            catalogue = Catalogue.from_json(found)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("the catalogue %s cannot be read (%s); building again", path, exc)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: the last to leave
        return catalogue

    def put(self, key: str, catalogue: Catalogue) -> None:
        """Keep `catalogue` under `key`. A folder that cannot be written only costs the next
        start its time: said once, never a failure of the source."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            with tempfile.NamedTemporaryFile(
                "w", dir=self.folder, suffix=".part", delete=False, encoding="utf-8"
            ) as out:
                json.dump(catalogue.as_json(), out, separators=(",", ":"))
            os.replace(out.name, self.folder / f"{key}.json")
            self._evict()
        except OSError as exc:
            log.warning("the catalogue cannot be kept in %s (%s)", self.folder, exc)

    def _evict(self) -> None:
        kept = sorted(self.folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in kept[KEPT:]:
            old.unlink(missing_ok=True)
        for part in self.folder.glob("*.part"):  # a write a crash cut short, an hour ago
            if part.stat().st_mtime < time.time() - 3600:
                part.unlink(missing_ok=True)
