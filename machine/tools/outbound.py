"""Where a source's outbound calls may go, and for how long: checked where it cannot be
slipped past, on the socket.

- **Reach.** A source a principal added (not the operator's) reaches only public addresses:
  every connection, each redirect hop's included, is checked on the address the host name
  resolved to, at connect time, and made to exactly that address (a second resolution
  could answer otherwise: DNS rebinding). Loopback, RFC 1918, CGNAT, unique-local,
  link-local, multicast, unspecified and reserved addresses, the IPv4 forms embedded in
  IPv6 (mapped, NAT64, 6to4), and the clouds' metadata addresses are refused, unless the
  operator allows a network (`LOCKGATE_SOURCE_ALLOWED_NETWORKS`). The operator's own sources
  reach what the operator configured.
- **A total deadline.** A call's whole exchange (connect, TLS, headers, body) ends within its
  bound: every read and write of the socket waits at most what is left of it, so an upstream
  sending one byte a second cannot hold a call past it.

Written against httpcore2's network backend (the layer under httpx2 that opens sockets),
since that is where the resolved address is known and the socket is made; httpx2 itself
offers neither a connect-time address check nor a deadline for a whole exchange.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import ssl
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import httpcore2
import httpx2
from httpcore2._backends.anyio import AnyIOBackend
from httpcore2._backends.base import AsyncNetworkStream, NetworkStream
from httpcore2._backends.sync import SyncBackend

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Cloud metadata endpoints, refused even where a network around them is allowed.
METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200", "192.0.0.192")
)
#: IPv6 prefixes that carry an IPv4 address (NAT64, 6to4): judged by the address they carry.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.ip_network("2002::/16")
#: What the refusal names, so a principal (and an operator) knows what to change.
SETTING = "LOCKGATE_SOURCE_ALLOWED_NETWORKS"


def embedded_v4(address: IPAddress) -> ipaddress.IPv4Address | None:
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _SIX_TO_FOUR:
        return address.sixtofour
    return None


@dataclass(frozen=True)
class Reach:
    """Which addresses a source may connect to. `public_only` for a principal's sources."""

    public_only: bool = False
    allowed: tuple[IPNetwork, ...] = ()

    @classmethod
    def of_setting(cls, text: str) -> tuple[IPNetwork, ...]:
        """`LOCKGATE_SOURCE_ALLOWED_NETWORKS`: CIDRs, comma-separated (ValueError if not)."""
        return tuple(
            ipaddress.ip_network(part.strip(), strict=False)
            for part in text.split(",")
            if part.strip()
        )

    def refusal(self, address: IPAddress) -> str | None:
        """Why `address` may not be reached (None: it may)."""
        if not self.public_only:
            return None
        if address in METADATA or (embedded_v4(address) or address) in METADATA:
            return "a cloud metadata address"
        if any(address in network for network in self.allowed):
            return None
        judged = embedded_v4(address) or address
        if judged.is_multicast:
            return "a multicast address"
        if not judged.is_global:
            return "a loopback, private, link-local or reserved address"
        return None


class DestinationRefused(httpcore2.ConnectError):
    """A connection a source may not make (its message says where and why)."""


def checked_addresses(reach: Reach, host: str, port: int) -> list[str]:
    """The addresses `host` resolves to that `reach` allows, or `DestinationRefused`."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise httpcore2.ConnectError(f"{host} could not be resolved ({exc.strerror})") from None
    found = list(dict.fromkeys(str(info[4][0]) for info in infos))
    allowed: list[tuple[str, str | None]] = []
    refused: list[tuple[str, str | None]] = []
    for text in found:
        why = reach.refusal(ipaddress.ip_address(text.split("%", 1)[0]))
        (refused if why else allowed).append((text, why))
    if not allowed:
        text, why = refused[0]
        where = f"{host} is {why}" if host.strip("[]") == text else f"{host} is {text}, {why}"
        raise DestinationRefused(
            f"{where}: a principal's source may reach only public addresses (the operator "
            f"may allow networks with {SETTING})"
        )
    return [text for text, _ in allowed]


@dataclass
class Deadline:
    """When the whole exchange must be over (time.monotonic())."""

    at: float

    def left(self, timeout: float | None) -> float:
        remaining = self.at - time.monotonic()
        if remaining <= 0:
            raise httpcore2.ReadTimeout("the call's total deadline passed")
        return remaining if timeout is None else min(timeout, remaining)


class _DeadlineStream(NetworkStream):
    def __init__(self, stream: NetworkStream, deadline: Deadline) -> None:
        self._stream, self._deadline = stream, deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, self._deadline.left(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._deadline.left(timeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> NetworkStream:
        tls = self._stream.start_tls(ssl_context, server_hostname, self._deadline.left(timeout))
        return _DeadlineStream(tls, self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class GuardedBackend(SyncBackend):
    """Sockets to allowed addresses only, read and written within the deadline."""

    def __init__(self, reach: Reach, deadline: Deadline) -> None:
        self.reach, self.deadline = reach, deadline

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> NetworkStream:
        addresses = checked_addresses(self.reach, host, port) if self.reach.public_only else [host]
        last: Exception | None = None
        for address in addresses:
            try:
                stream = super().connect_tcp(
                    address, port, self.deadline.left(timeout), local_address, socket_options
                )
            except httpcore2.ConnectError as exc:
                last = exc
                continue
            return _DeadlineStream(stream, self.deadline)
        assert last is not None
        raise last


class _AsyncDeadlineStream(AsyncNetworkStream):
    def __init__(self, stream: AsyncNetworkStream, deadline: Deadline | None) -> None:
        self._stream, self._deadline = stream, deadline

    def _left(self, timeout: float | None) -> float | None:
        return timeout if self._deadline is None else self._deadline.left(timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._stream.read(max_bytes, self._left(timeout))

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._stream.write(buffer, self._left(timeout))

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> AsyncNetworkStream:
        tls = await self._stream.start_tls(ssl_context, server_hostname, self._left(timeout))
        return _AsyncDeadlineStream(tls, self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class AsyncGuardedBackend(AnyIOBackend):
    """The async twin (an upstream MCP server over HTTP): allowed addresses only. Its calls
    are bounded by the caller (each MCP request has its own deadline), not per stream: the
    connection is held open between calls."""

    def __init__(self, reach: Reach) -> None:
        self.reach = reach

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> AsyncNetworkStream:
        import anyio

        if not self.reach.public_only:
            return await super().connect_tcp(host, port, timeout, local_address, socket_options)
        addresses = await anyio.to_thread.run_sync(checked_addresses, self.reach, host, port)
        last: Exception | None = None
        for address in addresses:
            try:
                stream = await super().connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except httpcore2.ConnectError as exc:
                last = exc
                continue
            return _AsyncDeadlineStream(stream, None)
        assert last is not None
        raise last


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The process's one TLS client context: the trust store (certifi's bundle, or
    `SSL_CERT_FILE` / `SSL_CERT_DIR`) read once. Reading it costs tens of milliseconds of
    CPU, which every outbound call paid twice (httpx2 makes a context per transport); one
    context serves every thread's connections (an `SSLContext` is shared safely)."""
    return httpx2.create_ssl_context(trust_env=True)


def guarded_transport(reach: Reach, total_secs: float, url: str) -> httpx2.HTTPTransport:
    """A transport for one exchange to `url`: connections checked against `reach`, the whole
    of it within `total_secs`. A principal's source never goes through a proxy (it would
    connect in our stead, to wherever it likes); the operator's honour the environment's
    (`HTTPS_PROXY`, `NO_PROXY`, ...), under the same deadline."""
    ssl_context = tls_context()
    transport = httpx2.HTTPTransport(verify=ssl_context, trust_env=False)
    backend = GuardedBackend(reach, Deadline(time.monotonic() + total_secs))
    proxy = None if reach.public_only else _environment_proxy(url)
    # The pool httpx2 made, rebuilt with our backend (httpx2 has no parameter for it).
    transport._pool = (
        httpcore2.HTTPProxy(
            proxy_url=proxy, ssl_context=ssl_context, network_backend=backend
        )
        if proxy
        else httpcore2.ConnectionPool(ssl_context=ssl_context, network_backend=backend)
    )
    return transport


def _environment_proxy(url: str) -> str | None:
    from urllib.parse import urlsplit
    from urllib.request import getproxies, proxy_bypass

    parts = urlsplit(url)
    proxy = getproxies().get(parts.scheme)
    if proxy is None or (parts.hostname and proxy_bypass(parts.hostname)):
        return None
    return proxy


def guarded_async_client(reach: Reach, timeout_secs: float) -> httpx2.AsyncClient:
    """An async client whose connections are checked against `reach`."""
    transport = httpx2.AsyncHTTPTransport(verify=tls_context(), trust_env=False)
    transport._pool = httpcore2.AsyncConnectionPool(
        ssl_context=tls_context(),
        network_backend=AsyncGuardedBackend(reach),
    )
    return httpx2.AsyncClient(
        transport=transport, timeout=timeout_secs, follow_redirects=True, trust_env=False
    )


def refusals(reach: Reach, urls: Sequence[str]) -> list[str]:
    """What is wrong with `urls` for a source reaching only what `reach` allows, as far as
    can be told now (their hosts resolved): before anyone is asked to approve adding it."""
    from urllib.parse import urlsplit

    found = []
    for url in urls:
        parts = urlsplit(url)
        if not parts.hostname:
            continue
        try:
            checked_addresses(reach, parts.hostname, parts.port or 443)
        except DestinationRefused as exc:
            found.append(str(exc))
        except httpcore2.ConnectError:
            continue  # unresolvable now: the call says so when it is made
    return found
