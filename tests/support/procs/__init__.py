"""Programs the real-process tests start (`python -m tests.support.procs.<name>`)."""
