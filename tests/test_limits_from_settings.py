"""The size limits a user configures are the ones applied, once.

Before, the sandbox cut results at its own 1 MiB and logs at its own 100,000 characters, and
the engine then cut the sandbox's truncation marker again at the setting: a result over 1 MiB
came back as a marker of a marker, naming the wrong original size.
"""

from __future__ import annotations

from collections.abc import Callable

from lockgate.machine.runtime import Runtime

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
