"""The container image's contract, run without a container engine: the Dockerfile's own
environment, entry point, command and health check, applied to the wheel installed apart
from the repository (as its `pip install .` does). The health check fails before the server
is ready and passes once it is; the key is made with the entry point as docs/deploying.md
shows; SIGTERM (the image's stop signal) drains and exits 0. And the Procfile's processes
name commands that exist."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lockgate.simulation.ports import free_port
from tests.support.wheel import PIP, wheel_fixture  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def instructions() -> dict[str, list[str]]:
    """Each Dockerfile instruction's arguments, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            found.setdefault(word, []).append(rest.strip())
    return found


def exec_form(value: str) -> list[str]:
    parsed = json.loads(value)
    assert isinstance(parsed, list) and all(isinstance(p, str) for p in parsed), value
    return parsed


def test_the_image_runs_as_a_user_with_its_data_on_a_volume() -> None:
    found = instructions()
    assert found["USER"] == ["lockgate"]
    assert found["VOLUME"] == ['["/data"]']
    env = dict(item.split("=", 1) for item in found["ENV"])
    assert env["DATABASE_URL"] == "sqlite:////data/lockgate.db"
    assert "/readyz" in found["HEALTHCHECK"][0]


def test_the_image_s_commands_serve_from_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [*PIP, "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    found = instructions()
    data = tmp_path / "data"
    data.mkdir()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKGATE_")}
    env.pop("DATABASE_URL", None)
    for item in found["ENV"]:
        name, value = item.split("=", 1)
        env[name] = value.replace("/data", str(data))
    env.update(LOCKGATE_PORT=str(port), PYTHONPATH=str(target))
    entrypoint = exec_form(found["ENTRYPOINT"][0])
    assert entrypoint == ["lockgate"]
    lockgate = [sys.executable, "-c", "from lockgate.server.cli import app; app()"]
    health = exec_form(found["HEALTHCHECK"][0].split("CMD", 1)[1].strip())
    assert health[0] == "python"
    check = [sys.executable, *health[1:]]

    def healthy() -> bool:
        return subprocess.run(check, env=env, capture_output=True, timeout=10).returncode == 0

    assert not healthy()  # nothing listens yet
    made = subprocess.run(
        [*lockgate, "keys", "create", "alice"], env=env, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        server = subprocess.Popen(
            [*lockgate, *exec_form(found["CMD"][0])],
            env=env,
            cwd=data,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while not healthy():
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the health check never passed"
            time.sleep(0.2)  # the platform's own polling, shortened
        assert (data / "lockgate.db").exists()
        server.send_signal(signal.SIGTERM)  # the image's STOPSIGNAL
        assert server.wait(timeout=30) == 0
    finally:
        if server.poll() is None:
            server.kill()


def test_the_procfile_names_a_release_step_and_a_web_process() -> None:
    processes = dict(
        line.split(":", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line
    )
    assert shlex.split(processes["release"]) == ["lockgate", "db", "upgrade"]
    web = shlex.split(processes["web"])
    assert web[:2] == ["lockgate", "serve"] and "$PORT" in web


def test_the_compose_example_uses_only_settings_that_exist() -> None:
    """The fleet example (compose.yaml) can only name configuration that exists."""
    import yaml

    from lockgate.machine.settings import Settings

    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    known = {f"LOCKGATE_{name.upper()}" for name in Settings.model_fields} | {"DATABASE_URL"}
    services = compose["services"]
    for name in ("migrate", "lockgate"):
        assert set(services[name]["environment"]) <= known, services[name]["environment"]
    assert services["migrate"]["command"] == ["db", "upgrade"]
    assert services["lockgate"]["deploy"]["replicas"] == 3
    assert "LOCKGATE_SIGNING_KEYS" in services["lockgate"]["environment"]
