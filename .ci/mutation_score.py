"""Mutation testing: run mutmut over a set of modules, score each module, enforce the goal.

    .ci/mutation_score.py gate     the write path and recovery (what .ci/run runs)
    .ci/mutation_score.py full     machine/ and the server's ledger and session modules
    .ci/mutation_score.py core|server|machine    one part of the full run
    .ci/mutation_score.py --report-only RUN      score the last run again
    .ci/mutation_score.py --resume RUN           go on with an interrupted run
    .ci/mutation_score.py machine --modules M... one slice of a part (the machine part takes
                                                 hours; a slice's results stand on their own)
    .ci/mutation_score.py RUN --mutants FILE     check only the mutants FILE names (one a line,
                                                 `*` patterns allowed): survivors again after
                                                 new tests, or what an interrupted run left

Each run gets its own directory, mutants/<run>/, holding a copy of pyproject.toml whose
`[tool.mutmut] only_mutate` names just that run's modules (links to the sources, the tests
and everything else mutmut needs); mutmut then builds mutants/<run>/mutants/ there. Only the
modules of the run carry mutmut's trampolines, so the tests run at nearly their usual speed.
The rest of the configuration (process isolation, the test selection) is the project's.

A module's score is killed / (total - listed equivalents): a mutant counts as killed when a
test failed (or timed out) on it; survivors, mutants no test covers and suspicious results
count against it. `.ci/equivalent_mutants.txt` lists the mutants verified by reading to
behave exactly as the original, one a line with its reason.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "mutants"
EQUIVALENTS = ROOT / ".ci" / "equivalent_mutants.txt"
GOAL = 90.0
#: Copied (as links) into each run's directory: what the tests import and read (the CLI
#: tests compare the README's settings table and the diagrams with what the code makes).
LINKED = ("machine", "server", "spec", "simulation", "tests", "diagrams")
LINKED_FILES = ("README.md",)
#: The installed namespace, and the folders it holds (see [tool.setuptools] in pyproject).
NAMESPACE = "lockgate"
PACKAGES = ("machine", "server", "spec", "simulation")

#: Held to the goal wherever they are mutated.
GOAL_MODULES = (
    "machine/write_path.py",
    "machine/recovery.py",
    "machine/instances.py",
    "machine/sessions.py",
    "machine/ledger.py",
    "server/durable_sessions.py",
    "server/session_gate.py",
    "server/owed_response.py",
)
GATE = ("machine/write_path.py", "machine/recovery.py")
CORE = (
    "machine/instances.py",
    "machine/sessions.py",
    "machine/ledger.py",
    "machine/lost_report.py",
)
SERVER = ("server/session_gate.py", "server/owed_response.py", "server/durable_sessions.py")
#: Mutated in the full run but not held to the goal.
OTHER = ("machine/*",)
#: Alembic revisions are history, run once per database: not mutated.
MIGRATIONS = ("machine/db/migrations/*",)

#: Test files the gate leaves out of the project's mutation test selection: they reach the
#: write path and recovery only incidentally (every test writes through the write path), so
#: they would make each surviving mutant cost the whole selection, not a few minutes in all.
GATE_SKIPS = (
    "tests/unit/test_ledger.py",
    "tests/unit/test_session_lease.py",
    "tests/unit/test_instances.py",
    "tests/unit/test_sessions_ledger.py",
    "tests/unit/test_sessions_lifecycle.py",
    "tests/unit/test_sessions_revived.py",
    "tests/unit/test_report_acks.py",
    "tests/unit/test_sessions_acks.py",
    "tests/unit/test_session_gate.py",
    "tests/unit/test_session_gate_owed_ids.py",
    "tests/unit/test_session_gate_sessions.py",
)

#: The test files the machine part adds to the project's selection: the tests of the modules
#: only that part mutates (sandbox, tools, policy, secrets, settings, the store's queries),
#: which the gate, core and server parts do not need to run.
MACHINE_TESTS = (
    "tests/processes/test_drain.py",
    "tests/server/test_effective_policy.py",
    "tests/unit/test_fair_slots.py",
    "tests/processes/test_fairness.py",
    "tests/processes/test_fault_switch.py",
    "tests/unit/test_limits_from_settings.py",
    "tests/unit/test_notes_source.py",
    "tests/unit/test_policy.py",
    "tests/unit/test_sandbox.py",
    "tests/unit/test_sandbox_failures.py",
    "tests/processes/test_sandbox_orphans.py",
    "tests/unit/test_secrets.py",
    "tests/unit/test_store.py",
    "tests/unit/test_tools_arguments.py",
    "tests/unit/test_tools_registry.py",
    "tests/unit/test_values.py",
    "tests/server/test_approval_signing_keys.py",
    "tests/unit/test_generated_lifecycle.py",
    "tests/unit/test_traces.py",
    "tests/unit/test_replay_logs.py",
    "tests/server/test_idempotent_execute.py",
    "tests/server/test_approval_api.py",
    "tests/server/test_approval_page.py",
    "tests/unit/test_cli.py",
    "tests/unit/test_server_runner.py",
    "tests/unit/test_api_keys.py",
    "tests/unit/test_error_texts.py",
    "tests/unit/test_tool_invocation.py",
    "tests/unit/test_engine_failures.py",
    "tests/unit/test_engine_races.py",
    "tests/unit/test_database_urls.py",
    # The two long Hypothesis runs (about 34 s each) reach nearly every function, and mutmut
    # runs a mutant's tests in no set order: every mutant of the engine that survived, and
    # many that did not, paid over a minute for them (4 mutants a minute on both cores). The
    # other tests of that file (each event's driver, the planted bugs) stay; `make test` runs
    # both.
    "--deselect",
    "tests/unit/test_generated_lifecycle.py::test_the_spec_as_a_state_machine",
    "--deselect",
    "tests/unit/test_generated_lifecycle.py::test_a_planted_recovery_bug_is_found",
    # Its child process inherits mutmut's MUTANT_UNDER_TEST but runs in a temporary folder
    # where mutmut finds no configuration; it tests that a snapshot moves between processes.
    "--deselect",
    "tests/unit/test_sandbox.py::test_resume_in_another_process",
)


class Part(NamedTuple):
    """One mutmut invocation: its directory name, the modules it mutates and those it leaves
    alone, the test files it leaves out of the project's selection and those it adds."""

    name: str
    only: tuple[str, ...]
    excluded: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    added: tuple[str, ...] = ()


PARTS: list[Part] = [
    Part("gate", GATE, skipped=GATE_SKIPS),
    Part("core", CORE),
    Part("server", SERVER),
    Part("machine", OTHER, excluded=GATE + CORE + MIGRATIONS, added=MACHINE_TESTS),
]
#: `full` is every part; each part can also be run (or re-scored) on its own.
RUNS: dict[str, list[Part]] = {"full": PARTS, **{part.name: [part] for part in PARTS}}

KILLED = {"killed", "timeout", "segfault", "caught by type check"}
STATUS_BY_EXIT_CODE: dict[int | None, str] = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    2: "interrupted",
    None: "not checked",
    33: "no tests",
    34: "skipped",
    35: "suspicious",
    36: "timeout",
    37: "caught by type check",
    -24: "timeout",
    24: "timeout",
    152: "timeout",
    255: "timeout",
    -11: "segfault",
    -9: "segfault",
}


@dataclass
class Score:
    module: str
    killed: int = 0
    equivalent: int = 0
    counted: int = 0
    not_killed: list[tuple[str, str]] = field(default_factory=list)

    @property
    def percent(self) -> float:
        return 100.0 * self.killed / self.counted if self.counted else 100.0


def equivalents() -> dict[str, str]:
    """Mutant name -> why it is equivalent, from the checked-in list."""
    found: dict[str, str] = {}
    if not EQUIVALENTS.exists():
        return found
    for line in EQUIVALENTS.read_text("utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition(" ")
        if not reason.strip():
            sys.exit(f"{EQUIVALENTS}: {name} has no reason")
        found[name] = reason.strip()
    return found


def check_selection(config: dict[str, object], part: Part) -> None:
    """Stop when the test selection names a test file that is not there (a file split or
    renamed: its tests would silently stop counting) or a run leaves out one it lacks."""
    selection = config.get("pytest_add_cli_args_test_selection", [])
    assert isinstance(selection, list)

    def files(args: list[object] | tuple[str, ...]) -> set[str]:
        return {str(arg).split("::")[0] for arg in args if str(arg).startswith("tests/")}

    named = files(selection)
    missing = sorted(name for name in named | files(part.added) if not (ROOT / name).exists())
    if missing:
        sys.exit(f"pyproject.toml: [tool.mutmut] selects test files that do not exist: {missing}")
    unselected = sorted(set(part.skipped) - named)
    if unselected:
        sys.exit(f"a run leaves out test files the selection does not name: {unselected}")


def prepare(directory: Path, part: Part) -> None:
    """A fresh run directory: links to the project, a pyproject.toml scoped to the part's
    modules (and whose mutation test selection leaves out or adds the part's test files)."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    for name in LINKED:
        (directory / name).symlink_to(ROOT / name, target_is_directory=True)
    for name in LINKED_FILES:
        (directory / name).symlink_to(ROOT / name)
    # mutmut names and imports a mutant by its path: under lockgate/ it is the module the
    # tests import (lockgate.machine.write_path), found here before the installed one.
    (directory / NAMESPACE).mkdir()
    for name in PACKAGES:
        (directory / NAMESPACE / name).symlink_to(ROOT / name, target_is_directory=True)
    only = tuple(f"{NAMESPACE}/{m}" for m in part.only)
    excluded = tuple(f"{NAMESPACE}/{m}" for m in part.excluded)
    skipped = part.skipped
    text = (ROOT / "pyproject.toml").read_text("utf-8")
    check_selection(tomllib.loads(text)["tool"]["mutmut"], part)
    scoped, count = re.subn(
        r"^only_mutate = .*$", f"only_mutate = {json.dumps(list(only))}", text, flags=re.M
    )
    if count != 1:
        sys.exit("pyproject.toml: [tool.mutmut] needs exactly one `only_mutate = [...]` line")
    if excluded:
        scoped = scoped.replace(
            "[tool.mutmut]\n", f"[tool.mutmut]\ndo_not_mutate = {json.dumps(list(excluded))}\n", 1
        )
    if skipped:
        start = scoped.index("[tool.mutmut]\n")
        end = scoped.index("\n[", start + 1)
        section = "\n".join(
            line
            for line in scoped[start:end].split("\n")
            if not any(f'"{name}' in line for name in skipped)
        )
        scoped = scoped[:start] + section + scoped[end:]
    if part.added:
        opening = "pytest_add_cli_args_test_selection = [\n"
        extra = "".join(f'    "{name}",\n' for name in part.added)
        scoped = scoped.replace(opening, opening + extra, 1)
    (directory / "pyproject.toml").write_text(scoped, "utf-8")


def run_mutmut(directory: Path, names: list[str]) -> None:
    mutmut = Path(sys.executable).with_name("mutmut")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    command = [str(mutmut), "run", "--max-children", str(os.cpu_count() or 2), *names]
    shown = command[1:4] + ([f"<{len(names)} mutants>"] if names else [])
    print(f"$ (cd {directory.relative_to(ROOT)} && {' '.join(shown)})", flush=True)
    # mutmut draws a spinner on the terminal; CI logs only need its last lines.
    done = subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True)
    tail = (done.stdout + done.stderr).replace("\r", "\n").splitlines()
    print("\n".join(line for line in tail[-8:] if line.strip()), flush=True)
    if done.returncode != 0:
        sys.exit(f"mutmut failed in {directory} (exit {done.returncode})")


def module_of(meta: Path, mutants_dir: Path) -> str:
    """The module's path in the repository (machine/write_path.py)."""
    relative = str(meta.relative_to(mutants_dir)).removesuffix(".meta")
    return relative.removeprefix(f"{NAMESPACE}/")


def scores(directories: list[Path]) -> dict[str, Score]:
    known = equivalents()
    found: dict[str, Score] = {}
    for directory in directories:
        mutants_dir = directory / "mutants"
        for meta in sorted(mutants_dir.rglob("*.py.meta")):
            module = module_of(meta, mutants_dir)
            data = json.loads(meta.read_text("utf-8"))
            codes: dict[str, int | None] = data["exit_code_by_key"]
            if not codes:
                continue
            score = found.setdefault(module, Score(module))
            for name, code in sorted(codes.items()):
                status = STATUS_BY_EXIT_CODE.get(code, "suspicious")
                if status in KILLED:
                    score.killed += 1
                    score.counted += 1
                elif name in known:
                    score.equivalent += 1
                else:
                    score.counted += 1
                    score.not_killed.append((name, status))
    return found


def report(found: dict[str, Score], held: tuple[str, ...]) -> bool:
    """Print the table and every mutant not killed; False when a held module is under goal."""
    ok = True
    print(f"\n{'module':34} {'killed':>7} {'total':>6} {'equiv':>6} {'score':>7}")
    for module in sorted(found):
        s = found[module]
        below = module in held and s.percent < GOAL
        ok = ok and not below
        mark = "  < goal" if below else ""
        line = f"{module:34} {s.killed:7} {s.counted:6} {s.equivalent:6} {s.percent:6.1f}%{mark}"
        print(line)
    for module in sorted(found):
        for name, status in found[module].not_killed:
            print(f"  {status:12} {name}")
    missing = [m for m in held if m not in found]
    for module in missing:
        print(f"{module}: no mutants were scored")
    return ok and not missing


def sliced(part: Part, modules: list[str]) -> Part:
    """`part` mutating only `modules`, each of which it mutates in full."""
    for module in modules:
        inside = any(fnmatch.fnmatch(module, pattern) for pattern in part.only)
        left_out = any(fnmatch.fnmatch(module, pattern) for pattern in part.excluded)
        if not inside or left_out or not (ROOT / module).is_file():
            sys.exit(f"--modules: {module} is not a module the {part.name} part mutates")
    return part._replace(only=tuple(modules), excluded=())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", choices=sorted(RUNS))
    parser.add_argument("--report-only", action="store_true", help="score the last run again")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on with an interrupted run: keep its directory and the results mutmut saved",
    )
    parser.add_argument(
        "--mutants",
        type=Path,
        metavar="FILE",
        help="check only the mutants this file names, one a line (`*` patterns allowed)",
    )
    parser.add_argument(
        "--modules",
        nargs="+",
        metavar="MODULE",
        help="mutate only these modules of the (one-part) run, e.g. machine/settings.py",
    )
    args = parser.parse_args()
    plan = RUNS[args.run]
    if args.modules:
        plan = [sliced(part, args.modules) for part in plan]
    directories = [WORK / part.name for part in plan]
    names: list[str] = []
    if args.mutants is not None:
        if not args.mutants.is_file():
            sys.exit(f"--mutants: {args.mutants} is not a file")
        lines = args.mutants.read_text("utf-8").splitlines()
        names = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    if not args.report_only:
        for part, directory in zip(plan, directories, strict=True):
            # mutmut checks only the mutants without a result, so a resumed run starts where
            # the interrupted one stopped (a run of the machine part takes hours).
            if not (args.resume and (directory / "pyproject.toml").exists()):
                prepare(directory, part)
            run_mutmut(directory, names)
    held = tuple(m for m in GOAL_MODULES if any(m in part.only for part in plan))
    if not report(scores(directories), held):
        sys.exit(f"mutation score under the goal of {GOAL:g}% killed")
    print(f"\nevery module held to the goal has at least {GOAL:g}% killed")


if __name__ == "__main__":
    main()
