"""DNS rebinding cannot carry a principal's source past the address check: a name that
resolves to a public address when it is checked before approval, and to loopback when the
call connects, is refused at the connection, which is made to the address that was checked
(never resolved again by the socket layer). DNS is the boundary here, so it is the one thing
replaced: `socket.getaddrinfo` answers as a rebinding resolver would; the listener is real."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpcore2
import httpx2
import pytest

from lockgate.machine.tools import outbound
from lockgate.machine.tools.outbound import Reach, guarded_transport, refusals
from tests.support.listener import Listener, listening

PUBLIC = "93.184.216.34"
NAME = "rebinding.example"


@pytest.fixture(name="listener")
def listener_fixture() -> Iterator[Listener]:
    with listening("127.0.0.1") as listener:
        yield listener


@pytest.fixture(name="answers")
def rebinding_resolver(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What `NAME` resolves to, one lookup after another (comma-separated addresses; the
    last answer repeats)."""
    answers: list[str] = []
    real = socket.getaddrinfo

    def resolve(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != NAME:
            return real(host, port, *args, **kwargs)
        addresses = answers.pop(0) if len(answers) > 1 else answers[0]
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))
            for address in addresses.split(",")
        ]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    return answers


def get(reach: Reach, url: str) -> httpx2.Response:
    with httpx2.Client(transport=guarded_transport(reach, 10, url)) as http:
        return http.get(url)


def test_a_name_rebound_to_loopback_after_the_check_is_refused_at_connect(
    listener: Listener, answers: list[str]
) -> None:
    url = f"http://{NAME}:{listener.port}/items"
    answers.extend([PUBLIC, "127.0.0.1"])
    principal = Reach(public_only=True)
    # Before approval the name is public: nothing to refuse yet.
    assert refusals(principal, [url]) == []
    # At the call it is loopback: refused at the connection, and nothing reached the listener.
    with pytest.raises(httpx2.ConnectError, match="loopback, private, link-local"):
        get(principal, url)
    assert listener.received == []


def test_the_connection_goes_to_the_address_that_was_checked(
    listener: Listener, answers: list[str]
) -> None:
    # Where loopback is allowed, the same name reaches the listener at the checked address:
    # the guard connects to what it resolved, so the refusal above is the check's doing.
    answers.append("127.0.0.1")
    allowed = Reach(public_only=True, allowed=Reach.of_setting("127.0.0.1/32"))
    answer = get(allowed, f"http://{NAME}:{listener.port}/items")
    assert answer.status_code == 200
    assert [seen.path for seen in listener.received] == ["/items"]


def test_of_the_addresses_a_name_has_only_the_allowed_are_connected_to(
    answers: list[str],
) -> None:
    answers.append(f"127.0.0.1,{PUBLIC},169.254.169.254")
    assert outbound.checked_addresses(Reach(public_only=True), NAME, 80) == [PUBLIC]
    answers[0] = "127.0.0.1,10.0.0.8"
    with pytest.raises(httpcore2.ConnectError, match="only public addresses"):
        outbound.checked_addresses(Reach(public_only=True), NAME, 80)
