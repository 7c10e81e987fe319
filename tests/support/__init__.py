"""What the tests share: servers started for real (`servers`), the SSE parser (`sse`), a
free loopback port (`ports`), the poller (`polling`), the canary secret (`canary`), the
PostgreSQL server the tests start (`postgres`), raw MCP session helpers (`sessions`), the
Hypothesis harness that drives the engine through the spec (`harness`), spec factories for
planted bugs (`spec_factories`), and the programs real-process tests launch (`procs`).

Nothing here is shipped: the runtime packages never import it.
"""
