"""Persistence: table definitions, engine creation, migrations and the SQL store."""
