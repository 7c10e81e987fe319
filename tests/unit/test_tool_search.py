"""Finding a tool, in process: a mistyped source or tool name in the code fails with the
closest names there are and a pointer to describe_tools; a question's words are read
without the words every summary has (`machine/tools/tool_search.py`)."""

from __future__ import annotations

import pytest

from lockgate.machine.tools.tool_search import query_terms, words_of
from lockgate.spec import ExecutionStatus as E
from tests.support.engine_records import MakeRuntime


@pytest.mark.parametrize(
    ("code", "said"),
    [
        ("tools.note.list()", "Did you mean tools.notes?"),
        ("tools.notes.lst()", "Did you mean tools.notes.list?"),
        ("tools.nothing_alike.x()", "module 'tools' has no attribute 'nothing_alike'"),
    ],
)
def test_a_mistyped_name_says_what_there_is(
    make_runtime: MakeRuntime, code: str, said: str
) -> None:
    done = make_runtime().engine.execute("alice", code)
    assert done.status == E.FAILED
    assert isinstance(done.error, dict)
    message = str(done.error["message"])
    assert said in message, message
    assert "describe_tools(query=...) finds a tool by what it does" in message


def test_a_question_is_read_by_its_words() -> None:
    assert words_of("repos_get_content (GET /repos/{owner}/{repo})") == (
        "repos get content get repos owner repo"
    )
    assert words_of("PostCustomers") == "post customers"
    assert query_terms("get a repository") == ["get", "repository"]
    assert query_terms("the") == ["the"]  # nothing else to go by
