"""`lockgate serve` with the leaking canary tools: `simulation.serve`, under the name the
tests start it by.

    python -m tests.support.procs.canary_server [--host H] [--port P]
"""

from __future__ import annotations

import sys

from lockgate.simulation.serve import main

if __name__ == "__main__":
    sys.exit(main())
