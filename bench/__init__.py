"""Lockgate's benchmark suite: each case measured side by side with its floor and a peer
(a bare fsync'd commit, DBOS, pydantic-monty run directly), alternating, in one invocation.

Run `make bench` (or `.venv/bin/python -m bench`); `--smoke` is the tiny run `.ci/run` makes
so the suite cannot rot. Results: `bench/results.json` and `bench/RESULTS.md`.
"""
