"""What the tests share:

- `servers` (the pytest plugin: fixtures and helpers, from `lockgate_server`,
  `server_deployment`, `server_fixtures`, `mcp_calls`, `raw_mcp`): `lockgate serve`
  processes started for real, deployments of them, MCP clients and raw MCP over HTTP;
- `sessions`: raw 2025-protocol sessions, and a proxy a test can cut;
- `sse`: the one SSE parser; `polling`: the one poller; `canary`: the one secret;
- `postgres`: the PostgreSQL server the tests start; `process_env`: a server's environment;
- `harness` with `lifecycle/`: the Hypothesis harness that drives the engine through the spec;
- `spec_factories` (planted spec bugs), `gate_tool` (a tool a test holds), and `procs/`
  (the programs real-process tests launch);
- per subject, what several test modules of it share: `session_gate` (the gate driven with
  scripted transports), `approval_app` and `people` (the approval page's app and the
  people who approve there), `security_target` (the two-principal server),
  `engine_records` and `engine_processes` (engine rows; engine processes killed and
  restarted), `sandboxes`, `tool_sources`, `diagram_trees`.

Nothing here is shipped: the runtime packages never import it.
"""
