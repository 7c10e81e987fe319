"""Fault injection: crash at every transition, restart, check the invariants."""
