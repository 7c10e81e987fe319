"""The Lockgate server: a Starlette app with MCP at /mcp, and the `lockgate` CLI."""
