"""The distribution installs one name, `lockgate`, and works from where it is installed.

The repository keeps its top-level folders (spec/, machine/, server/, simulation/); the wheel
maps them under the `lockgate` namespace, so installing Lockgate adds nothing to
site-packages that could collide with another distribution's `spec` or `server`. This
builds the wheel from a copy of the sources, reads what it holds, installs it into a folder
of its own and uses it from there: the CLI's entry point, the migrations, the diagrams.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.programs import require
from tests.support.wheel import PACKAGES, PIP, ROOT, wheel_fixture  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow


def test_the_wheel_holds_lockgate_and_its_metadata_only(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"lockgate", "lockgate-0.1.0.dist-info"}, sorted(tops)
    shipped = set(names)
    missing = [
        f"lockgate/{path.relative_to(ROOT).as_posix()}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "__pycache__" not in path.parts
        and f"lockgate/{path.relative_to(ROOT).as_posix()}" not in shipped
    ]
    assert not missing, f"not in the wheel (add the package to [tool.setuptools]): {missing}"
    assert {f"lockgate/{p}/py.typed" for p in PACKAGES} <= shipped
    assert "lockgate/machine/db/migrations/script.py.mako" in shipped
    entry_points = zipfile.ZipFile(wheel).read("lockgate-0.1.0.dist-info/entry_points.txt")
    assert b"lockgate = lockgate.server.cli:app" in entry_points


def test_the_installed_wheel_runs_from_where_it_is_installed(wheel: Path, tmp_path: Path) -> None:
    """Installed apart from the repository: it imports from the install, migrates a new
    database with the migrations it ships, and writes the diagrams where it is told."""
    require("dot", "graphviz")  # the diagrams' SVGs
    target = tmp_path / "site"
    subprocess.run(
        [*PIP, "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    installed = {p.name for p in target.iterdir() if not p.name.endswith(".dist-info")}
    assert installed <= {"lockgate", "bin"}, installed
    program = f"""
import sys
sys.path.insert(0, {str(target)!r})
import lockgate.server.cli as cli
from lockgate.machine.db.connect import open_engine
from lockgate.machine.db.migrate import upgrade, current_revision
assert cli.__file__.startswith({str(target)!r}), cli.__file__
engine = open_engine("sqlite:///{tmp_path / "fresh.db"}")
upgrade(engine)
print(current_revision(engine))
cli.app(["diagrams", "--out", {str(tmp_path / "diagrams")!r}])
"""
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("00"), done.stdout
    assert (tmp_path / "diagrams" / "README.md").exists()
