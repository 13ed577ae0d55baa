"""The order a publish writes a release in, whatever the store: every file, then each
signature, then ``SHA256SUMS``; nothing at all over a published release; a rerun skips what
is there. Driven through the ports with a target that records what it is asked (the real
directory and S3 targets are run in test_release_commands.py and
tests/integration/test_release_publish.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from pathlib import Path

import pytest

from controlplane.domain.checksums import FileDigest
from controlplane.domain.errors import ReleaseExists
from controlplane.ports import ReleaseSigner, ReleaseTarget, ReleaseToPublish, SideFile
from controlplane.services.publish import publish_release
from controlplane.services.release_check import CheckedRelease

FILES = {
    "config.pbtxt": FileDigest(10, "a" * 64),
    "1/model.py": FileDigest(20, "b" * 64),
}


class RecordingTarget:
    def __init__(self, *, committed: bool = False, holding: Collection[str] = ()) -> None:
        self.calls: list[str] = []
        self._committed = committed
        self._holding = set(holding)

    @property
    def uri(self) -> str:
        return "memory://m/r1"

    def committed(self) -> bool:
        return self._committed

    def clear_except(self, keep: Collection[str]) -> list[str]:
        self.calls.append("clear")
        return []

    def holds(self, rel: str, digest: FileDigest) -> bool:
        return rel in self._holding

    def put_file(self, rel: str, source: Path, digest: FileDigest) -> None:
        self.calls.append(f"file {rel}")

    def put_side_file(self, name: str, data: bytes) -> None:
        self.calls.append(f"side {name}")

    def commit(self, manifest: bytes) -> None:
        self.calls.append("commit")


class NamedSigner:
    def __init__(self, name: str) -> None:
        self.name = name

    def sign(self, release: ReleaseToPublish) -> SideFile:
        return SideFile(self.name, b"sig", signer="k")


async def _checked() -> CheckedRelease:
    return CheckedRelease("m", "r1", 3, 30, "python", "generated", ())


def _publish(target: ReleaseTarget, signers: list[ReleaseSigner] | None = None) -> object:
    release = ReleaseToPublish("m", "r1", Path("/nowhere"), FILES, b"manifest")
    return asyncio.run(
        publish_release(release, check=_checked, target=target, signers=signers or [])
    )


def test_files_then_every_signature_then_the_marker() -> None:
    target = RecordingTarget()

    _publish(target, [NamedSigner("SHA256SUMS.sig"), NamedSigner("model.sig")])

    assert target.calls == [
        "clear",
        "file 1/model.py",
        "file config.pbtxt",
        "side SHA256SUMS.sig",
        "side model.sig",
        "commit",
    ]


def test_a_published_release_is_refused_before_anything_is_written() -> None:
    target = RecordingTarget(committed=True)

    with pytest.raises(ReleaseExists, match="immutable"):
        _publish(target)

    assert target.calls == []


def test_a_rerun_writes_only_what_is_not_there_yet() -> None:
    target = RecordingTarget(holding={"config.pbtxt"})

    _publish(target)

    assert target.calls == ["clear", "file 1/model.py", "commit"]
