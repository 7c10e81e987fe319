"""Programs the real-process tests start (`python -m tests.procs.<name>`)."""
