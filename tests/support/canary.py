"""The canary: the one secret every test and simulated run configures (the notes tool's
token) and then searches for in every row, log line, page and response. It is the
simulator's own (`simulation.world.CANARY`), so a leak the suite finds is the one the
simulator looks for."""

from __future__ import annotations

from lockgate.simulation.world import CANARY

#: The approval-link signing key every server of a test on PostgreSQL shares, as every
#: instance of a deployment must (on SQLite they use the key file next to the database).
SIGNING_KEY = "tests-shared-approval-link-signing-key-5b1e"

__all__ = ["CANARY", "SIGNING_KEY"]
