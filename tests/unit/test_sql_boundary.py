"""`machine/db/` is the only code that speaks SQL.

Everything else reads through the store's typed queries (`store.sessions`, `store.instances`,
`store.executions`, `store.tool_calls`, `store.approvers`, `store.sign_ins`, `store.keys`,
`store.metrics`) and writes through `SqlStore.commit`: no other module imports sqlmodel or
sqlalchemy, or opens a session of its own (`.session()`). An AST scan
of spec/, machine/, server/ and simulation/ checks it (the simulator reads whole tables
through `AuditQueries`), so a query written elsewhere fails here, not in review.

There are no exceptions: `NOT_YET_MOVED` is empty and must stay so (move a new query into a
`machine/db/*_queries.py` class instead of listing its module here).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("spec", "machine", "server", "simulation")
#: The one package allowed to speak SQL.
SQL_PACKAGE = Path("machine") / "db"
#: Import roots that mean "this module builds or runs SQL itself".
SQL_LIBRARIES = frozenset({"sqlalchemy", "sqlmodel"})

#: Modules allowed to speak SQL outside machine/db/: none, and the test keeps it so.
NOT_YET_MOVED: dict[str, str] = {}


def violations(source: str) -> list[str]:
    """Where `source` speaks SQL itself: imports of the SQL libraries (at any depth, lazy
    imports inside functions included) and calls of a `.session()` method."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in SQL_LIBRARIES:
                    found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            # Relative imports (level > 0) are of this project's own modules.
            if node.level == 0 and (node.module or "").split(".")[0] in SQL_LIBRARIES:
                found.append(f"line {node.lineno}: from {node.module} import ...")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "session"
        ):
            found.append(f"line {node.lineno}: .session() call")
    return found


def scanned_modules() -> list[Path]:
    modules = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative.is_relative_to(SQL_PACKAGE):
                continue
            modules.append(relative)
    return modules


def test_only_machine_db_speaks_sql() -> None:
    offenders = {}
    for relative in scanned_modules():
        if relative.as_posix() in NOT_YET_MOVED:
            continue
        found = violations((ROOT / relative).read_text(encoding="utf-8"))
        if found:
            offenders[relative.as_posix()] = found
    assert not offenders, (
        "SQL outside machine/db/ (add a typed query to a machine/db/*_queries.py class and "
        f"call it through the store instead): {offenders}"
    )


def test_the_exceptions_still_need_to_be_exceptions() -> None:
    """An exception whose module was moved is removed from the list: it only shrinks."""
    stale = [
        name
        for name in NOT_YET_MOVED
        if not (ROOT / name).is_file() or not violations((ROOT / name).read_text("utf-8"))
    ]
    assert not stale, f"no longer speak SQL, remove from NOT_YET_MOVED: {stale}"
    assert not NOT_YET_MOVED, (
        "NOT_YET_MOVED only shrinks: move the new query into machine/db/ instead"
    )


def test_the_scan_sees_every_way_in() -> None:
    assert violations("import sqlalchemy")
    assert violations("import sqlalchemy.exc as e")
    assert violations("from sqlmodel import select")
    assert violations("from sqlalchemy.exc import IntegrityError")
    assert violations("def f():\n    from sqlalchemy import func\n")
    assert violations("with store.session() as s:\n    pass\n")
    assert violations("with self.runtime.engine.store.session() as s:\n    pass\n")
    assert not violations("from machine.db.schema import Execution")
    assert not violations("from .sqlmodel import x")
    assert not violations("store.sessions.get('s1')")
    assert not violations("import sqlalchemy_utils_lookalike")


def test_the_scan_covers_the_modules_that_used_to_speak_sql() -> None:
    scanned = {p.as_posix() for p in scanned_modules()}
    moved = {
        "machine/sessions.py",
        "machine/instances.py",
        "machine/recovery.py",
        "machine/runtime.py",
        "server/operations.py",
        "server/keys.py",
        "server/cli.py",
    }
    assert moved <= scanned
    assert not any(name.startswith("machine/db/") for name in scanned)


def test_query_classes_stay_small_and_say_what_they_read() -> None:
    """Each domain's reads are one small class (at most 15 public methods, so a domain that
    outgrows it is split), and every query says what it reads and why."""
    classes = 0
    for path in sorted((ROOT / SQL_PACKAGE).glob("*_queries.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not (isinstance(node, ast.ClassDef) and node.name.endswith("Queries")):
                continue
            classes += 1
            public = [
                item
                for item in node.body
                if isinstance(item, ast.FunctionDef) and not item.name.startswith("_")
            ]
            where = f"{path.name}:{node.name}"
            assert len(public) <= 15, f"{where} has {len(public)} public methods: split it"
            undocumented = [item.name for item in public if not ast.get_docstring(item)]
            assert not undocumented, f"{where}: say what these read and why: {undocumented}"
    assert classes >= 5
