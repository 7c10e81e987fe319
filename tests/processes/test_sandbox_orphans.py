"""A sandbox worker dies with its server: no orphan keeps running the agent's code.

The workers are real `monty` processes; the servers are real processes, killed with SIGKILL
(no handler, no cleanup runs). A worker is found through /proc (the children of each of the
parent's threads), and "gone" means it no longer exists, is a zombie (it runs nothing), or
its pid now names another process (same pid, another start time).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from lockgate.machine.sandbox import Finished, Sandbox, SandboxLimits
from tests.support.polling import wait_for
from tests.support.servers import (
    MODES,
    create_key_directly,
    make_deployment,
    mcp_client,
    run,
    structured,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc; Linux only")

#: Pure computation for longer than any deadline here (the server stops it at its 20 s
#: limit): it never calls a tool, so its worker has no reason to stop on its own.
SPIN = "n = 0\nwhile True:\n    n = n + 1\nn"
#: CPU time a worker must have used before we call it busy with SPIN.
BUSY_SECS = 0.2
#: SIGKILL of the parent must end its workers well before SPIN's 20 s limit would.
GONE_WITHIN_SECS = 5.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ROOT = Path(__file__).resolve().parents[2]


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3, the state, onwards)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text[text.rindex(")") + 2 :].split()


@dataclass(frozen=True)
class Worker:
    pid: int
    started: int  # start time in clock ticks since boot: tells a reused pid apart

    def stat(self) -> list[str] | None:
        return stat_fields(self.pid)

    def alive(self) -> bool:
        fields = self.stat()
        return fields is not None and fields[0] != "Z" and int(fields[19]) == self.started

    def cpu_secs(self) -> float:
        fields = self.stat()
        return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def children_by_thread(pid: int) -> dict[int, set[int]]:
    """Thread id -> the pids of the processes that thread forked (and that are not reaped)."""
    found: dict[int, set[int]] = {}
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return found
    for tid in tids:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        found[tid] = {int(child) for child in text.split()}
    return found


def monty_workers(pid: int) -> dict[Worker, int]:
    """The `monty` worker processes `pid` forked -> the id of the thread that forked each."""
    workers: dict[Worker, int] = {}
    for tid, children in children_by_thread(pid).items():
        for child in children:
            try:
                exe = os.readlink(f"/proc/{child}/exe")
            except (FileNotFoundError, ProcessLookupError):  # gone, or a zombie
                continue
            fields = stat_fields(child)
            # Not the launcher on its way to exec monty (see machine/sandbox.py).
            if Path(exe).name == "monty" and fields is not None:
                workers[Worker(child, int(fields[19]))] = tid
    return workers


def busy_workers(pid: int) -> list[Worker]:
    """The workers of `pid` that have computed for BUSY_SECS: SPIN is running in them."""
    return [w for w in monty_workers(pid) if w.cpu_secs() >= BUSY_SECS]


@pytest.fixture(name="reap")
def reap_fixture() -> Iterator[list[Worker]]:
    """Workers a test saw; any still alive at the end (the defect) are killed by pid, so a
    failing run does not leave an orphan computing for the next tests."""
    seen: list[Worker] = []
    yield seen
    for worker in seen:
        if worker.alive():
            os.kill(worker.pid, signal.SIGKILL)


def assert_all_gone(workers: list[Worker], what: str) -> None:
    def gone() -> bool:
        return not any(w.alive() for w in workers)

    wait_for(gone, f"{what}: workers {[w.pid for w in workers]} to exit", GONE_WITHIN_SECS)


@pytest.mark.slow
def test_sigkill_of_the_server_kills_the_worker_running_its_code(
    tmp_path: Path, reap: list[Worker]
) -> None:
    """`lockgate serve`, an execution computing in a worker, SIGKILL: the worker dies too
    (before, it was re-parented to PID 1 and computed on until its time limit, while the
    restarted server ran the same execution again)."""
    deployment = make_deployment(
        f"sqlite:///{tmp_path / 'lockgate.db'}", tmp_path, LOCKGATE_WAIT_BUDGET_SECS="0.2"
    )
    try:
        key = create_key_directly(deployment.database_url, "alice")
        server = deployment.start(name="doomed")

        async def execute() -> dict[str, object]:
            async with mcp_client(server.url, key, MODES[-1]) as client:
                return structured(await client.call_tool("execute", {"code": SPIN}))

        body = run(execute())
        assert body["status"] == "running", body
        wait_for(lambda: busy_workers(server.pid), "a worker computing the execution's code")
        workers = list(monty_workers(server.pid))
        reap.extend(workers)
        assert server.kill() == -signal.SIGKILL
        assert_all_gone(workers, "the server was SIGKILLed")
    finally:
        deployment.stop_all()


CHILD = f"""
import sys, threading
from lockgate.machine.sandbox import Sandbox, SandboxLimits
sandbox = Sandbox({{}}, SandboxLimits(max_duration_secs=20), max_processes=2)
# The step runs on a thread of its own, like a server's step: the main thread only waits.
threading.Thread(target=sandbox.start, args=({SPIN!r},), kwargs={{"principal": "p"}}).start()
threading.Event().wait()
"""


@pytest.mark.slow
def test_sigkill_of_a_process_holding_a_sandbox_kills_its_workers(reap: list[Worker]) -> None:
    """The same without a server: a bare Sandbox in a Python process, a step computing."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def computing() -> list[Worker]:
            if child.poll() is not None:
                assert child.stderr is not None
                pytest.fail(f"the child exited ({child.returncode}): {child.stderr.read()!r}")
            return busy_workers(child.pid)

        wait_for(computing, "a worker computing the step's code")
        workers = list(monty_workers(child.pid))
        reap.extend(workers)
        child.kill()
        assert child.wait(timeout=30) == -signal.SIGKILL
        assert_all_gone(workers, "the process holding the Sandbox was SIGKILLed")
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
        assert child.stderr is not None
        child.stderr.close()


def test_a_worker_outlives_the_thread_whose_step_needed_it(reap: list[Worker]) -> None:
    """A worker made for a step that runs on a short-lived thread does not belong to that
    thread: PR_SET_PDEATHSIG fires when the forking *thread* exits, so a worker forked by a
    step's thread would be killed under the next step once that thread ended. And close()
    still ends every worker."""
    me = os.getpid()
    before = set(monty_workers(me))
    sandbox = Sandbox({}, SandboxLimits(max_duration_secs=5), max_processes=2)
    try:
        warm = wait_for(lambda: set(monty_workers(me)) - before, "the pool's warm worker")
        reap.extend(warm)
        for worker in warm:  # so the step's checkout has to make a new worker
            os.kill(worker.pid, signal.SIGKILL)
        assert_all_gone(list(warm), "the warm worker was killed")

        outcome: list[object] = []
        made: dict[Worker, int] = {}

        def step() -> None:
            outcome.append(sandbox.start("6 * 7", principal="p"))
            # Read while this thread lives: once it ends, the kernel hands its children to
            # another thread of the process (sending them their death signal, if set).
            made.update((w, t) for w, t in monty_workers(me).items() if w not in before | warm)

        stepper = threading.Thread(target=step)
        stepper.start()
        stepper.join()
        assert [type(o) for o in outcome] == [Finished], outcome
        assert isinstance(outcome[0], Finished) and outcome[0].output == 42
        assert made, "the step ran without a worker of this Sandbox"
        reap.extend(made)
        assert stepper.native_id not in made.values(), "the step's own thread forked the worker"

        # The step's thread is gone: its worker is not, and serves the next step.
        again = sandbox.start("6 * 7", principal="p")
        assert isinstance(again, Finished) and again.output == 42, again
        assert all(w.alive() for w in made), "a worker died with the thread of the step"
        assert set(monty_workers(me)) - before == set(made)
    finally:
        sandbox.close()
    assert_all_gone(reap, "the Sandbox was closed")


def test_code_runs_although_the_idle_worker_it_would_get_was_killed(reap: list[Worker]) -> None:
    """An idle worker killed under the Sandbox (the OOM killer, an operator) is replaced:
    the next step gets a fresh one instead of failing as a crashed sandbox."""
    me = os.getpid()
    before = set(monty_workers(me))
    sandbox = Sandbox({}, SandboxLimits(max_duration_secs=5), max_processes=1)
    try:
        warm = wait_for(lambda: set(monty_workers(me)) - before, "the pool's warm worker")
        reap.extend(warm)
        for worker in warm:  # and at once, before the pool can have noticed
            os.kill(worker.pid, signal.SIGKILL)
        step = sandbox.start("6 * 7", principal="p")
        assert isinstance(step, Finished) and step.output == 42, step
    finally:
        sandbox.close()
