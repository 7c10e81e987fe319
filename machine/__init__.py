"""The runtime that executes the lifecycle specs: machines, write path, store, recovery."""
