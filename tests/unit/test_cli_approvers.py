"""`lockgate approvers`: adding, listing, enrolling, signing out and removing the people who
approve, on the configured database; bad input exits 2 with one line, an unknown approver
exits 1, never a trace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lockgate.server.cli import app
from tests.support.people import ENROLMENT_LINK, people_of

runner = CliRunner()


@pytest.fixture
def database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'people.db'}"
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("LOCKGATE_PUBLIC_URL", "https://approve.example")
    return url


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["approvers", *args])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def test_a_passkey_approver_gets_a_link_on_the_terminal_and_can_be_enrolled_again(
    database: str,
) -> None:
    code, out = invoke("add", "Ann Example", "--principal", "alice", "--principal", "carol")
    assert code == 0, out
    approver = re.match(r"approver (\w+): Ann Example, decides for alice, carol", out)
    assert approver is not None, out
    first = ENROLMENT_LINK.search(out)
    assert first is not None and out.count("https://approve.example/enrol/") == 1
    code, again = invoke("enrol", approver.group(1))
    second = ENROLMENT_LINK.search(again)
    assert code == 0 and second is not None and second.group(1) != first.group(1)
    with people_of(database) as people:
        # The newer link works; the older one was revoked by it.
        people.enrolment(second.group(1))
        with pytest.raises(Exception, match="replaced by a newer one"):
            people.enrolment(first.group(1))
    code, listed = invoke("list")
    assert code == 0 and "Ann Example" in listed and "enrolment link pending" in listed


def test_an_openid_approver_and_every_approver_s_sign_out(database: str) -> None:
    code, out = invoke(
        "add",
        "Bo",
        "--issuer",
        "https://id.example",
        "--email",
        "bo@example.com",
        "--all-principals",
    )
    assert code == 0 and "decides for every principal" in out, out
    assert "signs in at https://id.example as verified email bo@example.com" in out
    assert "/enrol/" not in out
    [bo] = re.findall(r"approver (\w+):", out)
    code, refused = invoke("enrol", bo)
    assert code == 1 and "signs in with https://id.example, not with a passkey" in refused
    with people_of(database) as people:
        people.open_session(people.get(bo), "oidc")
    code, out = invoke("sign-out", "--all")
    assert code == 0 and "signed out 1 session(s)" in out
    code, out = invoke("remove", bo)
    assert code == 0 and f"removed {bo} (Bo)" in out


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (("add", "Ann"), 2, "--principal NAME"),
        (("add", "Ann", "--principal", "a", "--subject", "x"), 2, "need --issuer"),
        (
            ("add", "Ann", "--principal", "a", "--issuer", "ftp://x", "--subject", "x"),
            2,
            "issuer URL",
        ),
        (("add", "Ann", "--principal", "a", "--email", "nope"), 2, "not an email address"),
        (("remove", "nobody"), 1, "No approver 'nobody'. lockgate approvers list shows them."),
        (("enrol", "nobody"), 1, "No approver 'nobody'"),
        (("sign-out",), 2, "Name one approver id, or pass --all."),
        (("sign-out", "nobody"), 1, "No approver 'nobody'"),
    ],
)
def test_bad_input_is_refused_in_one_line(
    database: str, args: tuple[str, ...], code: int, words: str
) -> None:
    exit_code, out = invoke(*args)
    assert exit_code == code, out
    assert words in out
