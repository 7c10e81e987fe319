"""Your own Python tools: a source written against the registry's interface, loaded from the
sources file (`[[python]] factory = "module:callable"`, with options) or from an installed
package's `lockgate.sources` entry point, and called by agent code like any built-in tool;
a factory that cannot make a source stops the start with a message naming it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lockgate.machine.tools.errors import InvalidToolSource
from lockgate.machine.tools.http_calls import HttpLimits
from lockgate.machine.tools.plugins import installed_sources
from lockgate.machine.tools.source_file import load_sources
from lockgate.spec import ExecutionStatus
from tests.support.engine_records import MakeRuntime

FACTORY = "tests.support.greeter_plugin:make_source"


def test_a_source_from_the_sources_file_is_called_like_a_built_in(
    make_runtime: MakeRuntime, tmp_path: Path
) -> None:
    sources = tmp_path / "sources.toml"
    sources.write_text(f'[[python]]\nfactory = "{FACTORY}"\noptions = {{ greeting = "hi" }}\n')
    rt = make_runtime(sources_file=sources)
    done = rt.engine.execute("alice", 'tools.greeter.greet(name="ada")')
    assert done.status is ExecutionStatus.COMPLETED, done.error
    assert done.result == "hi, ada"
    # Its schema is enforced like any tool's, before the call.
    refused = rt.engine.execute(
        "alice", 'try:\n    tools.greeter.greet(name="")\nexcept TypeError as e:\n    r = str(e)\nr'
    )
    assert refused.result == (
        "tools.greeter.greet: argument 'name': '' should be non-empty (rule: minLength)"
    )


def test_an_installed_package_s_entry_point_adds_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What `pip install` of a package declaring the entry point leaves on the path.
    info = tmp_path / "greeter_tools-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: greeter-tools\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[lockgate.sources]\ngreeter = {FACTORY}\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    [source] = installed_sources()
    assert source.name == "greeter"
    [tool] = source.tools()
    assert tool.spec.call_name == "tools.greeter.greet"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('factory = "tests.support.greeter_plugin"', "is not 'module:callable'"),
        ('factory = "no_such_module_xyz:make"', "module 'no_such_module_xyz' cannot be imported"),
        ('factory = "tests.support.greeter_plugin:missing"', "is not a callable"),
        (
            'factory = "tests.support.greeter_plugin:not_a_source"',
            "it returned object, not a tool source",
        ),
        (f'factory = "{FACTORY}"\noptions = {{ colour = 1 }}', "making the source failed"),
        (f'factory = "{FACTORY}"\nname = "x"', "unknown keys name"),
        ("options = {}", "has no factory"),
    ],
)
def test_a_factory_that_cannot_make_a_source_is_refused_naming_it(
    tmp_path: Path, table: str, message: str
) -> None:
    sources = tmp_path / "sources.toml"
    sources.write_text(f"[[python]]\n{table}\n")
    with pytest.raises(InvalidToolSource, match=message) as caught:
        load_sources(sources, HttpLimits())
    assert caught.value.message.startswith(f"[[python]] number 1 of {sources}")
