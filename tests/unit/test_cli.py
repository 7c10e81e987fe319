"""The `lockgate` CLI: clear output, exit codes 0/1/2."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import lockgate.server.cli as cli
from lockgate.spec import EXECUTION, MACHINES
from tests.support.spec_factories import with_states

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def test_spec_check_passes_on_the_shipped_spec() -> None:
    result = runner.invoke(cli.app, ["spec", "check"])
    assert result.exit_code == 0, result.output
    assert "execution: 8 states" in result.output


def test_spec_check_fails_with_the_rule_named(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = {**MACHINES, "execution": with_states(EXECUTION, running={"on_crash": None})}
    monkeypatch.setattr(cli, "MACHINES", broken)
    result = runner.invoke(cli.app, ["spec", "check"])
    assert result.exit_code == 1
    assert "execution: state 'running': [no_recovery_edge]" in result.output


def test_model_check_prints_counts_and_passes() -> None:
    result = runner.invoke(cli.app, ["model-check"])
    assert result.exit_code == 0, result.output
    assert "execution_with_tool_call:" in result.output and "states" in result.output
    assert "no invariant violated" in result.output


def test_diagrams_check_detects_drift(tmp_path: Path) -> None:
    copy = tmp_path / "diagrams"
    shutil.copytree(Path(__file__).resolve().parents[2] / cli.DEFAULT_DIAGRAMS, copy)
    assert runner.invoke(cli.app, ["diagrams", "--check", "--out", str(copy)]).exit_code == 0
    (copy / "session.mmd").write_text("stateDiagram-v2\n", encoding="utf-8")
    result = runner.invoke(cli.app, ["diagrams", "--check", "--out", str(copy)])
    assert result.exit_code == 1
    assert "lockgate diagrams" in result.output


def test_usage_errors_exit_with_2() -> None:
    assert runner.invoke(cli.app, ["no-such-command"]).exit_code == 2
    assert runner.invoke(cli.app, ["diagrams", "--no-such-flag"]).exit_code == 2


def test_the_documented_settings_table_matches_the_settings_model() -> None:
    from lockgate.machine.settings_reference import reference_table

    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    block = page.split("<!-- settings:start -->\n", 1)[1].split("<!-- settings:end -->", 1)[0]
    assert block == reference_table(), (
        "run `lockgate settings` and paste it into docs/configuration.md"
    )
    result = runner.invoke(cli.app, ["settings"])
    assert result.exit_code == 0 and result.output == reference_table()


def test_the_cli_reference_page_matches_the_cli(tmp_path: Path) -> None:
    """docs/cli.md is typer's own Markdown for the app, generated, never edited by hand."""
    generated = tmp_path / "cli.md"
    typer_docs = [sys.executable, "-m", "typer", "lockgate.server.cli", "utils", "docs"]
    subprocess.run(
        [*typer_docs, "--name", "lockgate", "--output", str(generated)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    committed = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert committed == generated.read_text(encoding="utf-8"), (
        "docs/cli.md is stale: run `make docs` (it runs `python -m typer lockgate.server.cli "
        "utils docs --name lockgate --output docs/cli.md`)"
    )


def test_db_upgrade_migrates_and_reports_errors_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'x.db'}")
    result = runner.invoke(cli.app, ["db", "upgrade"])
    assert result.exit_code == 0 and "revision 0020" in result.output
    monkeypatch.setenv("DATABASE_URL", "mysql://somewhere/db")
    result = runner.invoke(cli.app, ["db", "upgrade"])
    assert result.exit_code == 2 and "must be a sqlite" in result.output
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody:s3cret@127.0.0.1:1/db")
    result = runner.invoke(cli.app, ["db", "upgrade"])
    assert result.exit_code == 1 and "could not migrate" in result.output
    assert "s3cret" not in result.output


def test_the_served_log_never_carries_an_enrolment_link_s_secret(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The log as `lockgate serve` sets it up: an access line for an enrolment link (whose
    secret registers a passkey) keeps the path and drops the secret; an approval page's
    path stays whole (it names a call and authorises nothing)."""
    import json
    import logging

    from lockgate.server.operations import configure_logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    link_id, execution_id = "0f" * 16, "e2" * 16
    try:
        configure_logging("json")
        access = logging.getLogger("lockgate.test.access")
        for path in (f"/enrol/{link_id}.abcDEF-123_x", f"/approve/{execution_id}/1"):
            access.info('%s - "%s %s HTTP/1.1" %d', "127.0.0.1:5", "GET", path, 200)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    enrolment, approval = capsys.readouterr().err.splitlines()
    assert "abcDEF-123_x" not in enrolment, enrolment
    assert f"GET /enrol/{link_id}." in json.loads(enrolment)["message"], enrolment
    assert f"GET /approve/{execution_id}/1 " in json.loads(approval)["message"], approval


def test_settings_come_from_the_environment_and_an_optional_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lockgate.machine.settings import Settings

    config = tmp_path / "lockgate.env"
    config.write_text("LOCKGATE_PORT=9123\nLOCKGATE_APPROVAL_TTL=60\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert Settings().port == 9123 and Settings().approval_ttl.total_seconds() == 60
    monkeypatch.setenv("LOCKGATE_PORT", "9200")  # the environment wins over the file
    assert Settings().port == 9200
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    monkeypatch.chdir(empty)
    assert Settings().approval_ttl.total_seconds() == 86400  # no file is fine


def test_an_invalid_configuration_names_each_variable_and_no_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pydantic import ValidationError

    from lockgate.machine.settings import Settings
    from lockgate.machine.settings_reference import invalid_configuration

    monkeypatch.setenv("LOCKGATE_PORT", "not-a-port-s3cr3t")
    monkeypatch.setenv("LOCKGATE_EVENT_LOOP", "trio")
    monkeypatch.setenv("DATABASE_URL", "mysql://admin:hunter2@db/x")
    with pytest.raises(ValidationError) as caught:
        Settings()
    told = invalid_configuration(caught.value)
    for variable in ("LOCKGATE_PORT", "LOCKGATE_EVENT_LOOP", "DATABASE_URL"):
        assert variable in told, told
    assert "s3cr3t" not in told and "hunter2" not in told, told
    assert "lockgate settings" in told


@pytest.mark.parametrize("command", [["keys", "list"], ["db", "upgrade"], ["sources", "list"]])
def test_every_command_refuses_an_invalid_configuration_in_words(
    monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    from typer.testing import CliRunner

    from lockgate.server import cli

    monkeypatch.setenv("LOCKGATE_EVENT_LOOP", "trio")
    result = CliRunner().invoke(cli.app, command)
    assert result.exit_code == 2, result.output
    assert "invalid configuration: LOCKGATE_EVENT_LOOP" in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
