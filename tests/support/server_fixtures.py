"""The pytest fixtures that give tests running servers, and the types they yield.

`fleet` starts, once per database kind for the whole session, the `shared` server (the
fast tests share it, each with its own executions and note keys) and the `short` one
(a 0.2 s wait budget and a 1 s approval TTL) side by side; `deployment` is a fresh
database per test for the tests that start, kill and restart their own servers.

They are defined here and imported into `tests.support.servers`, the one module test
modules name in `pytest_plugins`, so each is registered once for the session: a session
fixture imported into several test modules would be several fixtures, each starting its
own servers.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.lockgate_server import LockgateServer
from tests.support.server_deployment import (
    Command,
    Deployment,
    Key,
    make_deployment,
    new_database_url,
)

DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@dataclass
class SharedServer:
    """A server shared by many tests, with two principals' keys."""

    deployment: Deployment
    server: LockgateServer
    alice: str
    bob: str

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def base_url(self) -> str:
        return self.server.base_url


@dataclass
class Fleet:
    shared: SharedServer
    short: SharedServer
    #: A key of the shared server made with `lockgate keys create carol` (for revocation).
    carol: Key


def create_key_directly(database_url: str, principal: str) -> str:
    """An API key written straight to the database (fast set-up; the CLI is tested apart)."""
    from lockgate.machine.db.migrate import prepare_database
    from lockgate.machine.db.store import SqlStore
    from lockgate.machine.settings import Settings
    from lockgate.server.keys import ApiKeys

    engine = prepare_database(Settings(database_url=database_url))
    try:
        return ApiKeys(SqlStore(engine)).create(principal).secret
    finally:
        engine.dispose()


#: The shared server keeps small limits so the bad-input tests stay cheap.
SHARED_SETTINGS = {"LOCKGATE_MAX_CODE_CHARS": "2000", "LOCKGATE_MAX_REQUEST_BYTES": "65536"}
#: The short server answers `running` after 0.2 s and lets approvals expire after 1 s.
SHORT_SETTINGS = {"LOCKGATE_WAIT_BUDGET_SECS": "0.2", "LOCKGATE_APPROVAL_TTL": "1"}


@pytest.fixture(name="fleet", scope="session", params=DATABASES)
def fleet_fixture(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """Two servers per database kind for the whole session, started side by side."""
    kind: str = request.param
    deployments: list[Deployment] = []
    carol: Command | None = None
    try:
        started = []
        for name, settings in (("shared", SHARED_SETTINGS), ("short", SHORT_SETTINGS)):
            directory = tmp_path_factory.mktemp(f"{name}-{kind}")
            deployment = make_deployment(
                new_database_url(request, kind, directory),
                directory,
                LOCKGATE_INSTANCE_NAME=f"{name}-{uuid.uuid4().hex[:6]}",
                **settings,
            )
            deployments.append(deployment)
            alice = create_key_directly(deployment.database_url, "alice")
            bob = create_key_directly(deployment.database_url, "bob")
            started.append((deployment, deployment.spawn(name=name), alice, bob))
        # The CLI on the (already migrated) database, while the servers boot.
        carol = deployments[0].cli_start("keys", "create", "carol")
        made = carol.key("carol")
        for _, server, _, _ in started:
            server.wait_ready()
        shared, short = (SharedServer(*entry) for entry in started)
        yield Fleet(shared, short, made)
    finally:
        if carol is not None:
            carol.stop()
        for deployment in deployments:
            deployment.stop_all()


@pytest.fixture(name="shared")
def shared_fixture(fleet: Fleet) -> SharedServer:
    return fleet.shared


@pytest.fixture(name="short")
def short_fixture(fleet: Fleet) -> SharedServer:
    return fleet.short


@pytest.fixture(name="deployment")
def deployment_fixture(database_url: str, tmp_path: Path) -> Iterator[Deployment]:
    """A fresh database of each kind for tests that start and kill their own servers."""
    made = make_deployment(
        database_url,
        tmp_path,
        LOCKGATE_LEASE_TTL="1",
        LOCKGATE_HEARTBEAT_INTERVAL="0.2",
    )
    try:
        yield made
    finally:
        made.stop_all()
