"""The parts of the Hypothesis harness (`tests/support/harness.py`), which drives the engine
through every event of the spec: the random choices, the programs agent code runs, the
simulated deployment of instances, what the client knows, the replay of the log through the
spec, the checks, and one module of drivers per lifecycle (executions and calls, instances,
sessions and the ledger) plus a crash at any point."""
