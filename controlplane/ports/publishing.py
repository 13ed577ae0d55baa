"""The publisher's seams (``controlplane release publish``): where a release is uploaded, and
what signs it.

A release is committed by its ``SHA256SUMS``: a :class:`ReleaseTarget` takes every file
first, then each signature, then the marker, whose write refuses to replace one already
there (a release is immutable). A :class:`ReleaseSigner` makes one side file of the release
from what is published; each scheme is one signer (the openssl-compatible signature of the
statement and ``SHA256SUMS`` today), so another one is one more signer and the upload stays
as it is.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from controlplane.domain.checksums import FileDigest


@dataclass(frozen=True)
class ReleaseToPublish:
    """What is published: the release dir, its files' digests, and the bytes of its
    ``SHA256SUMS`` (written by the publisher, or the dir's own, checked)."""

    model: str
    release: str
    path: Path
    files: Mapping[str, FileDigest]  # relative path -> digest; SHA256SUMS and signatures not
    manifest: bytes


@dataclass(frozen=True)
class SideFile:
    """A file published beside the release's files, never listed in ``SHA256SUMS``: a
    signature, uploaded after the files and before the marker."""

    name: str
    data: bytes
    signer: str  # who signed it, for the publisher's report (a key file's name)


class ReleaseSigner(Protocol):
    def sign(self, release: ReleaseToPublish) -> SideFile:
        """The signature file of ``release``; a key that cannot sign is ``invalid_request``."""
        ...


class ReleaseTarget(Protocol):
    """One release's place in a store (``<store>/<model>/<release>/``), being written."""

    @property
    def uri(self) -> str:
        """Where it is, for messages."""
        ...

    def committed(self) -> bool:
        """Whether the release's ``SHA256SUMS`` is there: it is published, and immutable."""
        ...

    def clear_except(self, keep: Collection[str]) -> list[str]:
        """Delete what an earlier, cut publish left that is not to be published now (other
        files, temp files); return their paths. Only called before the marker exists."""
        ...

    def holds(self, rel: str, digest: FileDigest) -> bool:
        """Whether ``rel`` is there already with these bytes (a rerun skips it)."""
        ...

    def put_file(self, rel: str, source: Path, digest: FileDigest) -> None:
        """Upload ``source`` as ``rel`` (whole, or not at all); large files in parts."""
        ...

    def put_side_file(self, name: str, data: bytes) -> None:
        """Upload a signature file (replacing one an earlier, cut publish left)."""
        ...

    def commit(self, manifest: bytes) -> None:
        """Write ``SHA256SUMS`` last; ``release_exists`` if one appeared meanwhile."""
        ...
