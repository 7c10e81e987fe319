"""`lockgate serve` with the canary tool source (simulation/canary.py) next to the notes tools:
the server the real-process simulation and the secret tests run, with the `held` tool
(simulation/held.py) that stays in flight until the harness releases it, and the `desk` tool
(simulation/desk.py) that asks its user before it writes a note.

    python -m simulation.serve [--host H] [--port P]

The same serve path as the console script (server.cli_serve.run_server), configured through the
environment only; the canary tools read their secret from `LOCKGATE_SECRET_CANARY_TOKEN`.
They leak it into a result, an error message and an unexpected exception, so a test that
finds no secret in what this server answered, logged or stored has proved the scrubbing.
"""

from __future__ import annotations

import argparse
import sys

import typer

from lockgate.machine.settings import Settings
from lockgate.machine.tools.notes import NotesSource
from lockgate.server.cli_serve import run_server
from lockgate.simulation.canary import CanarySource
from lockgate.simulation.desk import DeskSource
from lockgate.simulation.held import HeldSource


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulation.serve")
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args(argv)
    # The desk writes through a notes source of its own on the same folder (the notes
    # serialize their writes across sources and processes with flock).
    desk = DeskSource(NotesSource(Settings().notes_dir))
    try:
        run_server(args.host, args.port, extra_sources=[CanarySource(), HeldSource(), desk])
    except typer.Exit as stopped:  # a refused configuration: its message is already printed
        return stopped.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
