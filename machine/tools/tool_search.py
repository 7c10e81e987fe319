"""Finding a tool by what it does: `describe_tools(query)` ranked by BM25 over each tool's
name, summary and path, with SQLite's own full-text engine (FTS5, Porter stemming) in
memory, so a plain-English query ("get a repository", "get file contents") finds the
operation among GitHub's 1,223 by its words, not by the alphabet.

The tools holding every word of the query are found (ranked); when no tool holds them all,
those holding all of them but one ("get file contents" finds "Get repository content").
Common English words are left out of the query: "a", "the" and "of" are in every summary
and would match everything. FTS5 rather than a BM25 package: it ships with Python's
sqlite3, so ranking costs no new dependency.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Sequence

from lockgate.machine.tools.spec import ToolSpec

#: Words a query is read without (they say nothing about which tool is meant).
STOP_WORDS = frozenset(
    (
        "a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "does", "for", "from", "how",
        "i", "in", "is", "it", "its", "me", "my", "of", "on", "or", "please", "that", "the",
        "this", "to", "what", "when", "where", "which", "with", "you", "your",
    )
)
#: What a word counts for in a tool's name, its summary and its path (an operation's
#: summary says what it does in the words a person asks with: "Get a repository").
WEIGHTS = (2.0, 3.0, 0.5)
_WORD = re.compile(r"[A-Za-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def words_of(text: str) -> str:
    """`text` as words: snake_case, camelCase, paths and punctuation split apart."""
    return " ".join(_WORD.findall(_CAMEL.sub(" ", text))).lower()


def query_terms(query: str) -> list[str]:
    """The query's words, without stop words (all of them, if it has nothing else)."""
    words = words_of(query).split()
    kept = [w for w in words if w not in STOP_WORDS]
    return list(dict.fromkeys(kept or words))


def _fields(spec: ToolSpec) -> tuple[str, str, str]:
    """A tool's name, summary and path (an OpenAPI description ends `(GET /path)`; the
    method is left out: every read's would match "get")."""
    summary, _, path = spec.description.rpartition(" (")
    if not summary or not path.endswith(")"):
        summary, path = spec.description, ""
    path = path.partition(" ")[2] or path
    return words_of(f"{spec.source} {spec.name}"), words_of(summary), words_of(path)


class ToolIndex:
    """A full-text index of some tools, built once (their registry's tools are fixed)."""

    def __init__(self, specs: Sequence[ToolSpec]) -> None:
        self.specs = list(specs)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.execute(
            "CREATE VIRTUAL TABLE tool USING fts5(name, summary, path, tokenize='porter unicode61')"
        )
        self._db.executemany(
            "INSERT INTO tool (rowid, name, summary, path) VALUES (?, ?, ?, ?)",
            [(n, *_fields(spec)) for n, spec in enumerate(self.specs)],
        )

    def _rows(self, match: str) -> list[int]:
        with self._lock:
            found = self._db.execute(
                "SELECT rowid FROM tool WHERE tool MATCH ? ORDER BY bm25(tool, ?, ?, ?)",
                (match, *WEIGHTS),
            ).fetchall()
        return [row[0] for row in found]

    def search(self, query: str) -> list[ToolSpec] | None:
        """The tools `query` finds, best first (None: the query has no words to rank by):
        those holding every word, or else those holding all words but one."""
        terms = query_terms(query)
        if not terms:
            return None
        quoted = [f'"{term}"' for term in terms]  # each a plain word, never FTS syntax
        ranked = self._rows(" OR ".join(quoted))
        holding = [set(self._rows(term)) for term in quoted]
        for need in dict.fromkeys((len(terms), max(1, len(terms) - 1))):
            found = [row for row in ranked if sum(row in held for held in holding) >= need]
            if found:
                return [self.specs[row] for row in found]
        return []
