"""An ASGI app the tests need as a real HTTP server on loopback (an API, a webhook endpoint,
a balancer): uvicorn in a thread, on a free port, until the generator closes."""

from __future__ import annotations

import threading
from collections.abc import Generator
from typing import Any

import uvicorn

from lockgate.simulation.ports import free_port


def serve_in_thread(app: Any, name: str, port: int | None = None) -> Generator[int]:
    """Serve `app` on 127.0.0.1 (`port`, or a free one); yields the port once it listens."""
    port = port or free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off")
    )
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError(f"{name} did not start")
            thread.join(0.01)  # polls uvicorn's own flag; nothing else signals it
        yield port
    finally:
        server.should_exit = True
        thread.join(10)
