"""The limits a user configures are the ones applied, and size limits once.

Before, the sandbox cut results at its own 1 MiB and logs at its own 100,000 characters, and
the engine then cut the sandbox's truncation marker again at the setting: a result over 1 MiB
came back as a marker of a marker, naming the wrong original size.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from lockgate.machine.runtime import Runtime
from lockgate.machine.sandbox_limits import SandboxLimits
from lockgate.spec.session_lease import LeasePolicy

MakeRuntime = Callable[..., Runtime]


def test_a_result_over_every_limit_is_cut_once_at_the_setting(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime(max_result_bytes=4096)
    view = runtime.engine.execute("alice", "'x' * 2_000_000")
    result = view.result
    assert isinstance(result, dict) and result["truncated"] is True
    assert result["original_bytes"] == 2_000_002  # the JSON string, quotes included
    preview = result["preview"]
    assert isinstance(preview, str) and preview.startswith('"xxx')
    assert "4096 bytes" in str(result["note"])


def test_logs_are_cut_at_the_setting(make_runtime: MakeRuntime) -> None:
    runtime = make_runtime(max_log_chars=150_000)
    view = runtime.engine.execute("alice", "print('y' * 120_000)\n1")
    assert view.logs is not None
    assert view.logs.count("y") == 120_000  # under the setting: nothing cut
    assert "truncated" not in view.logs


def test_every_setting_reaches_the_part_that_applies_it(make_runtime: MakeRuntime) -> None:
    """Each setting differs from its default, so a setting that is not passed on (the part
    keeping its own default) shows."""
    same_name = {
        "max_duration_secs": 7,
        "max_memory_bytes": 64 * 1024 * 1024,
        "max_recursion_depth": 90,
        "max_calls": 12,
        "max_log_chars": 6000,
    }
    runtime = make_runtime(
        **same_name,
        max_result_bytes=5000,
        sandbox_workers=3,
        max_workers_per_principal=2,
        conservative_recovery=True,
        lease_ttl=timedelta(seconds=40),
        instance_name="instance-a",
        policy="notes.read=approve,notes.delete=block",
        session_idle_timeout=timedelta(minutes=2),
        session_lease=timedelta(minutes=3),
        session_cap=timedelta(minutes=9),
    )
    sandbox = runtime.sandbox
    assert sandbox.limits == SandboxLimits(**same_name, max_output_bytes=5000)
    assert (sandbox.slots.capacity, sandbox.slots.per_principal) == (3, 2)
    assert runtime.engine.write.conservative is True
    assert (runtime.lease.name, runtime.lease.ttl) == ("instance-a", timedelta(seconds=40))
    assert runtime.engine.policy.configured.to_text() == "notes.read=approve,notes.delete=block"
    assert runtime.sessions.policy == LeasePolicy(
        idle_timeout=timedelta(minutes=2), lease=timedelta(minutes=3), cap=timedelta(minutes=9)
    )
