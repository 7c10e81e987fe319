"""A real `lockgate serve` on SQLite whose sources file exposes the conformance suite's fixture
tools directly (`tests.support.conformance_tools`, `expose = "direct"`): what the tests of
direct tools and of both task flavours start. Direct tools are the server's listing and
answers, so one database kind is enough."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.conformance_suite import ROOT
from tests.support.server_deployment import Deployment, make_deployment

FACTORY = "tests.support.conformance_tools:make_source"


@pytest.fixture(name="deployment")
def sqlite_deployment_fixture(tmp_path: Path) -> Iterator[Deployment]:
    made = make_deployment(f"sqlite:///{tmp_path / 'lockgate.db'}", tmp_path)
    try:
        yield made
    finally:
        made.stop_all()


def direct_settings(folder: Path, effects: Path, **settings: str) -> dict[str, str]:
    """The server's settings: the fixture tools exposed directly, each deletion
    confirm_delete makes written to `effects`, and `settings` besides."""
    sources = folder / "sources.toml"
    sources.write_text(
        f'[[python]]\nfactory = "{FACTORY}"\nexpose = "direct"\n'
        f'options = {{ effects = "{effects}" }}\n'
    )
    # The fixture source is a module of the tests.
    return {"LOCKGATE_SOURCES_FILE": str(sources), "PYTHONPATH": str(ROOT), **settings}
