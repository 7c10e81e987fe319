"""The Lockgate server: FastAPI + MCP, and the `lockgate` CLI."""
