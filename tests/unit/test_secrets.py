from __future__ import annotations

import pytest
from pydantic import JsonValue

from lockgate.machine.errors import ErrorCode
from lockgate.machine.secrets import (
    REDACTED,
    EnvironmentSecrets,
    MissingSecret,
    Redactor,
    StaticSecrets,
    environment_variable,
)

TOKEN = "s3cr3t-token-value"
OTHER = "hunter2hunter2"


def test_environment_variable_names() -> None:
    assert environment_variable("notes_token") == "LOCKGATE_SECRET_NOTES_TOKEN"
    assert environment_variable("github-token", "X_") == "X_GITHUB_TOKEN"
    assert environment_variable("GitHub.Token") == "LOCKGATE_SECRET_GITHUB_TOKEN"


def test_environment_secrets_are_read_at_resolve_time(monkeypatch: pytest.MonkeyPatch) -> None:
    store = EnvironmentSecrets()
    monkeypatch.setenv("LOCKGATE_SECRET_NOTES_TOKEN", TOKEN)
    assert store.resolve(["notes_token"]) == {"notes_token": TOKEN}
    assert store.resolve([]) == {}


def test_environment_secrets_missing_names_every_absent_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCKGATE_SECRET_NOTES_TOKEN", TOKEN)
    monkeypatch.delenv("LOCKGATE_SECRET_MAIL_KEY", raising=False)
    monkeypatch.setenv("LOCKGATE_SECRET_EMPTY", "")  # set but empty counts as missing
    with pytest.raises(MissingSecret) as caught:
        EnvironmentSecrets().resolve(["notes_token", "mail_key", "empty"])
    error = caught.value
    assert error.names == ("mail_key", "empty")
    assert error.code is ErrorCode.NOT_FOUND
    assert "'mail_key'" in error.message and "'empty'" in error.message
    assert error.hint is not None and "LOCKGATE_SECRET_MAIL_KEY" in error.hint
    assert TOKEN not in str(error.as_dict())


def test_environment_secrets_custom_prefix_and_mapping() -> None:
    store = EnvironmentSecrets(prefix="APP_", environ={"APP_API_KEY": OTHER})
    assert store.resolve(["api_key"]) == {"api_key": OTHER}
    assert "APP_" in repr(store)
    with pytest.raises(MissingSecret) as caught:
        store.resolve(["api_key", "mail-key", "Other.Key"])
    # The hint names the variables to set, under this store's prefix.
    assert caught.value.hint == "Set the environment variable(s) APP_MAIL_KEY, APP_OTHER_KEY."


def test_static_secrets() -> None:
    store = StaticSecrets({"notes_token": TOKEN, "blank": ""})
    assert store.resolve(["notes_token"]) == {"notes_token": TOKEN}
    with pytest.raises(MissingSecret) as caught:
        store.resolve(["notes_token", "absent", "blank"])
    assert caught.value.names == ("absent", "blank")
    assert TOKEN not in str(caught.value.as_dict())
    assert caught.value.message == "secrets 'absent', 'blank' not configured"


def test_single_missing_secret_message() -> None:
    assert MissingSecret(["x"]).message == "secret 'x' not configured"


def test_reprs_never_show_values() -> None:
    assert TOKEN not in repr(StaticSecrets({"notes_token": TOKEN}))
    assert "notes_token" in repr(StaticSecrets({"notes_token": TOKEN}))
    assert TOKEN not in repr(Redactor([TOKEN]))


def test_redact_text_replaces_every_occurrence() -> None:
    redactor = Redactor([TOKEN, OTHER])
    text = f"a {TOKEN} b {TOKEN}{OTHER} c"
    assert redactor.redact_text(text) == f"a {REDACTED} b {REDACTED}{REDACTED} c"


def test_longer_secret_containing_a_shorter_one_is_replaced_whole() -> None:
    redactor = Redactor(["abcd", "xxabcdxx"])
    assert redactor.redact_text("1 xxabcdxx 2 abcd") == f"1 {REDACTED} 2 {REDACTED}"


def test_a_secret_that_starts_another_leaves_no_tail_of_the_longer() -> None:
    # Both match at the same place: only the longer tried first hides all of it.
    for values in (["abcd", "abcdTAIL"], ["abcdTAIL", "abcd"]):
        assert Redactor(values).redact_text("k=abcdTAIL;") == f"k={REDACTED};"


def test_regex_characters_in_secrets_are_literal() -> None:
    redactor = Redactor(["a.b*c+(d)"])
    assert redactor.redact_text("a.b*c+(d) aXbbbc+d") == f"{REDACTED} aXbbbc+d"


def test_short_values_are_ignored() -> None:
    redactor = Redactor(["", "ab", "abc"])
    assert not redactor
    assert redactor.redact_text("abc ab") == "abc ab"
    assert Redactor(["abcd"]).redact_text("xabcdx") == f"x{REDACTED}x"


def test_redact_nested_json() -> None:
    redactor = Redactor.from_secrets({"notes_token": TOKEN})
    value: JsonValue = {
        "plain": 1,
        f"key-{TOKEN}": [f"Bearer {TOKEN}", {"deep": [TOKEN, None, True, 2.5]}],
        "ok": "nothing here",
    }
    assert redactor.redact(value) == {
        "plain": 1,
        f"key-{REDACTED}": [f"Bearer {REDACTED}", {"deep": [REDACTED, None, True, 2.5]}],
        "ok": "nothing here",
    }
    assert TOKEN in str(value)  # the input is not modified
    assert redactor.redact(TOKEN) == REDACTED
    assert redactor.redact(None) is None


def test_empty_redactor_returns_values_unchanged() -> None:
    redactor = Redactor()
    assert redactor.redact_text(TOKEN) == TOKEN
    assert redactor.redact({"a": [TOKEN]}) == {"a": [TOKEN]}


def test_extended_redactor_knows_old_and_new_values() -> None:
    redactor = Redactor([TOKEN]).extended([OTHER])
    assert redactor.redact_text(f"{TOKEN} {OTHER}") == f"{REDACTED} {REDACTED}"


def test_redact_exception_message() -> None:
    redactor = Redactor([TOKEN])
    assert redactor.redact_exception_message(ValueError(f"bad token {TOKEN}")) == (
        f"bad token {REDACTED}"
    )
    assert redactor.redact_exception_message(KeyError()) == "KeyError"
