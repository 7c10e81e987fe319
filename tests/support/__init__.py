"""What the tests share:

- `servers` (the pytest plugin: fixtures and helpers, from `lockgate_server`,
  `server_deployment`, `server_fixtures`, `mcp_calls`, `raw_mcp`): `lockgate serve`
  processes started for real, deployments of them, MCP clients and raw MCP over HTTP;
- `sessions`: raw 2025-protocol sessions, and a proxy a test can cut;
- `sse`: the one SSE parser; `polling`: the one poller; `canary`: the one secret;
- `postgres`: the PostgreSQL server the tests start; `process_env`: a server's environment;
- `harness` with `lifecycle/`: the Hypothesis harness that drives the engine through the spec;
- `spec_factories` (planted spec bugs), `gate_tool` (a tool a test holds), and `procs/`
  (the programs real-process tests launch).

Nothing here is shipped: the runtime packages never import it.
"""
