"""A restart serves a large API from the tools it built before (`openapi_catalogue`): GitHub's
published description (13 MB, 1,223 operations) is read and checked once, kept under its
digest, and the next start serves the same tools from that, calls included; a changed
document, a damaged file or a principal's source never use what was kept."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockgate.machine.settings import Settings
from lockgate.machine.tools.errors import InvalidArguments
from lockgate.machine.tools.http_calls import HttpLimits
from lockgate.machine.tools.kinds.openapi import OPENAPI
from lockgate.machine.tools.registry import ToolRegistry
from lockgate.machine.tools.source_file import load_sources
from lockgate.machine.tools.source_tables import REQUEST
from lockgate.machine.tools.spec import ToolContext, ToolSource
from tests.support.published import (
    github_rest_description,
    github_sources_file,
    github_stand_in,
)

pytestmark = pytest.mark.slow  # installs the published description from npm on first use

SERVED_AGAIN = "served from the tools built before from the same document"


@pytest.fixture(name="github_url")
def github_fixture() -> Iterator[str]:
    with github_stand_in() as url:
        yield url


def _one(sources: Path, limits: HttpLimits) -> ToolSource:
    [source] = load_sources(sources, limits)
    return source


def test_a_restart_serves_github_from_what_it_built_before(
    tmp_path: Path, github_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    sources = github_sources_file(tmp_path, github_url)
    limits = HttpLimits(catalogues=tmp_path / "catalogues")
    with caplog.at_level("INFO", logger="lockgate.sources"):
        first = _one(sources, limits)
    assert SERVED_AGAIN not in caplog.text
    assert len(list((tmp_path / "catalogues").glob("*.json"))) == 1
    caplog.clear()
    with caplog.at_level("INFO", logger="lockgate.sources"):
        again = _one(sources, limits)
    assert f"source 'github': {SERVED_AGAIN}" in caplog.text
    assert [t.spec.model_dump() for t in again.tools()] == [
        t.spec.model_dump() for t in first.tools()
    ]

    # The tools served again check arguments and call the API as the first ones did.
    registry = ToolRegistry()
    registry.register(again)
    with pytest.raises(InvalidArguments, match="owner"):
        registry.validate_arguments("github.repos_get", {"repo": "Hello-World"}, [])
    arguments = registry.validate_arguments(
        "github.repos_get", {"owner": "octocat", "repo": "Hello-World"}, []
    )
    answer = registry.get("github.repos_get").call(
        arguments, ToolContext(idempotency_key="e:1", secrets={}, principal_id="alice")
    )
    assert answer == {"full_name": "octocat/Hello-World", "private": False}


def test_a_changed_or_damaged_catalogue_is_built_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sources = github_sources_file(tmp_path)
    limits = HttpLimits(catalogues=tmp_path / "catalogues")
    _one(sources, limits)
    [kept] = (tmp_path / "catalogues").glob("*.json")

    # A changed document is another key: built again, the change served.
    document = json.loads((tmp_path / "github.json").read_text())
    document["paths"]["/repos/{owner}/{repo}"]["get"]["summary"] = "Fetch one repository"
    (tmp_path / "github.json").write_text(json.dumps(document))
    with caplog.at_level("INFO", logger="lockgate.sources"):
        changed = _one(sources, limits)
    assert SERVED_AGAIN not in caplog.text
    specs = {t.spec.name: t.spec for t in changed.tools()}
    assert specs["repos_get"].description.startswith("Fetch one repository")
    assert len(list((tmp_path / "catalogues").glob("*.json"))) == 2

    # A damaged file is said and built again, never served.
    shutil.copy(github_rest_description(), tmp_path / "github.json")
    kept.write_text('{"operations": [')
    caplog.clear()
    with caplog.at_level("INFO", logger="lockgate.sources"):
        rebuilt = _one(sources, limits)
    assert "cannot be read" in caplog.text and SERVED_AGAIN not in caplog.text
    assert len(rebuilt.tools()) == 1223
    assert json.loads(kept.read_text())["operations"]


def test_a_principal_s_source_keeps_nothing_on_the_server(tmp_path: Path) -> None:
    shelf = tmp_path / "catalogues"
    limits = HttpLimits(catalogues=shelf).for_principal(())
    text = github_rest_description().read_text()
    made = OPENAPI.build(
        {"name": "github", "document": text, "base_url": "https://api.github.com"},
        REQUEST,
        limits,
        None,
    )
    assert len(made.tools()) == 1223
    assert not shelf.exists()


def test_the_catalogue_folder_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_CATALOGUE_DIR", "")
    assert Settings().catalogue_dir is None
    monkeypatch.setenv("LOCKGATE_CATALOGUE_DIR", "/srv/lockgate/catalogues")
    assert Settings().catalogue_dir == Path("/srv/lockgate/catalogues")
    monkeypatch.delenv("LOCKGATE_CATALOGUE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "/var/cache/me")
    assert Settings().catalogue_dir == Path("/var/cache/me/lockgate/catalogues")
