"""A person at a running server: an approver of some principals, signed in on the server's
database, whose browser reaches the server at the host its links name.

A server on a loopback address names itself `http://localhost:<port>` in its links (and
checks a decision's Origin against that), while the tests start it on `127.0.0.1`; the
person's browser goes where the links point. The sign-in itself is opened through the
product's `People` (`tests.support.people.signed_in`): the ceremonies are tested apart.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from tests.support.people import Approver, signed_in


def links_base(base_url: str) -> str:
    """Where a loopback server's links point: its base URL with `localhost` for its host."""
    return base_url.replace("://127.0.0.1:", "://localhost:")


@contextmanager
def approver_at(
    database_url: str, base_url: str, principals: Sequence[str], name: str = "Ann Approver"
) -> Iterator[Approver]:
    """A new approver of `principals`, signed in, deciding on the server at `base_url`."""
    person = signed_in(database_url, links_base(base_url), name, principals)
    try:
        yield person
    finally:
        person.close()
