"""Programs the tests run that no Python package brings, each with the Debian package that
does (`make test` installs them where it can: `make test-deps`). A test that needs a missing
one skips and names the package; on CI (`CI` set: `.ci/run` installs them all) it fails, so a
CI run never passes by skipping."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest


def missing(what: str, package: str) -> NoReturn:
    """Skip (or, on CI, fail) a test for want of `what`, which `package` brings."""
    if os.environ.get("CI"):
        pytest.fail(f"missing here: {what} (.ci/run installs the {package} package)")
    pytest.skip(
        f"not installed here: {what} (Debian: apt-get install {package}; `make test-deps` "
        "installs every program the tests need)"
    )


def require(program: str, package: str) -> str:
    """The path of `program`, or the test skips (on CI, fails) naming `package`."""
    found = shutil.which(program)
    if found is None:
        missing(f"`{program}`", package)
    return found
