"""Sealed snapshots: the envelope around a Monty dump that the store keeps between steps.

A paused execution may be resumed much later, by another process or server version, so the
envelope names the Monty version that made it (a dump loads only in that version) and carries
the tool calls made so far (Monty's own suspension counter restarts at every load). Monty does
not authenticate dumps (flipped bits can load and run), hence the digest.
"""

from __future__ import annotations

import hashlib
import re
import struct

import pydantic_monty

from lockgate.machine.errors import ErrorCode, LockgateError

MONTY_VERSION: str = pydantic_monty.__version__

# --- errors ---------------------------------------------------------------------------------


class RuntimeMismatch(LockgateError):
    """The snapshot was made by another Monty version: it cannot be loaded by this one."""

    code = ErrorCode.RUNTIME_MISMATCH

    def __init__(self, *, sealed_version: str, running_version: str = MONTY_VERSION) -> None:
        self.sealed_version, self.running_version = sealed_version, running_version
        super().__init__(
            f"this execution was paused by sandbox runtime (Monty) {sealed_version}, but this "
            f"server runs Monty {running_version}: the paused execution cannot be resumed by "
            "this server version",
            hint=(
                "Re-execute the code from the start, or resume it on a server running Monty "
                f"{sealed_version}."
            ),
        )


class SnapshotCorrupt(LockgateError):
    """The sealed snapshot is not one of ours, or its bytes changed since it was sealed."""

    code = ErrorCode.SNAPSHOT_CORRUPT

    def __init__(self, detail: str) -> None:
        super().__init__(
            f"the stored snapshot of this paused execution is damaged ({detail}); it cannot "
            "be resumed",
            hint="Re-execute the code from the start.",
        )


# --- sealed snapshots -----------------------------------------------------------------------
# Layout: MAGIC | u8 length + ASCII Monty version | sha256(payload) | payload, where
# payload = u32 tool calls made so far | Monty dump. The version comes before the digest so a
# snapshot from another version is reported as a mismatch even if that version sealed
# differently. sha256 detects corruption, not tampering: whoever can write the store could
# recompute it.

_MAGIC = b"LGSNAP\x00\x01"
_DIGEST_LEN = 32
_CALLS = struct.Struct(">I")
_VERSION_RE = re.compile(rb"[0-9A-Za-z.+\-]{1,64}")


def seal(dump: bytes, calls: int, version: str = MONTY_VERSION) -> bytes:
    """Wrap a Monty dump in our envelope (`version` is a parameter for tests only)."""
    encoded = version.encode("ascii")
    payload = _CALLS.pack(calls) + dump
    return _MAGIC + bytes([len(encoded)]) + encoded + hashlib.sha256(payload).digest() + payload


def _open_envelope(sealed: bytes) -> tuple[str, bytes, bytes]:
    """(version, digest, payload); raises SnapshotCorrupt if it is not our envelope."""
    if not sealed.startswith(_MAGIC):
        raise SnapshotCorrupt("it is not a Lockgate snapshot")
    at = len(_MAGIC)
    length = sealed[at] if len(sealed) > at else 0
    version = sealed[at + 1 : at + 1 + length]
    if not _VERSION_RE.fullmatch(version):
        raise SnapshotCorrupt("its header is unreadable")
    at += 1 + length
    digest, payload = sealed[at : at + _DIGEST_LEN], sealed[at + _DIGEST_LEN :]
    return version.decode("ascii"), digest, payload


def sealed_version(sealed: bytes) -> str:
    """The Monty version that made a sealed snapshot, read without loading it."""
    return _open_envelope(sealed)[0]


def unseal(sealed: bytes) -> tuple[bytes, int]:
    """(Monty dump, tool calls made so far); raises RuntimeMismatch or SnapshotCorrupt."""
    version, digest, payload = _open_envelope(sealed)
    if version != MONTY_VERSION:
        raise RuntimeMismatch(sealed_version=version)
    if len(payload) < _CALLS.size or hashlib.sha256(payload).digest() != digest:
        raise SnapshotCorrupt("its checksum does not match")
    (calls,) = _CALLS.unpack_from(payload)
    return payload[_CALLS.size :], calls
