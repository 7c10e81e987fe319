"""The environment a Lockgate process under test starts with: the test's database and notes,
the canary as the notes token, on PostgreSQL the deployment's shared link-signing key, one
worker process, and nothing inherited from the caller's own LOCKGATE_*."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.canary import CANARY, SIGNING_KEY


def lockgate_env(database_url: str, notes_dir: Path, **settings: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("LOCKGATE_") and k != "DATABASE_URL"
    }
    env.update(
        DATABASE_URL=database_url,
        LOCKGATE_NOTES_DIR=str(notes_dir),
        LOCKGATE_SECRET_NOTES_TOKEN=CANARY,
        LOCKGATE_INSTANCE_NAME="a",
        # The tests' clients stand in for the person and accept with resume's action; the
        # tests of the other approval modes set their own.
        LOCKGATE_APPROVAL_MODE="model",
        # One process per server: a test that kills or crashes "the server" means the one
        # instance it talks to. The fleet, the soak and the workers' own tests run the
        # default (one worker per core) with LOCKGATE_WORKERS=0.
        LOCKGATE_WORKERS="1",
    )
    if not database_url.startswith("sqlite"):
        # Every instance of a deployment on PostgreSQL signs approval links with one key
        # (without it they refuse to start); on SQLite they share the database's key file.
        env["LOCKGATE_SIGNING_KEYS"] = SIGNING_KEY
    env.update(settings)
    return env
