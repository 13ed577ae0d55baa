"""Watching Triton's repository for a model dir that is not a complete, verified release.

:class:`PlacementAudit` polls ``<repository>/<model>*`` in a thread while a test deploys.
Every dir that carries the daemon's release marker must hold exactly the files of that
release as published, byte for byte (SHA256), plus what staging adds: the marker, the
bytecode of Python sources, and ``config.pbtxt`` (rewritten to the slot's name, so only its
presence is checked). Anything else (a missing file, a wrong byte, a stray temp file) is a
corrupt placement and is recorded with what was seen. Files are hashed once per inode, since
placed files never change.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path

from controlplane.adapters.staging.fs import MARKER_NAME
from tests.support.sampling import Sampler

_ADDED_BY_STAGING = {MARKER_NAME}


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            sha.update(chunk)
    return sha.hexdigest()


class PlacementAudit(Sampler):
    """Polls the model's dirs in the repository; ``violations`` lists every bad placement."""

    def __init__(self, repository: Path, model: str, every: float = 0.05) -> None:
        super().__init__(every, "placement-audit")
        self._repository = repository
        self._model = model
        self._releases: dict[str, dict[str, str]] = {}
        self._hashed: dict[tuple[int, int, int], str] = {}
        self._lock = threading.Lock()
        self.violations: list[str] = []
        self.placements_seen: set[tuple[str, str]] = set()  # (dir name, release)
        self.rounds = 0

    def expect(self, release: str, files: Mapping[str, str]) -> None:
        """The published files of ``release``: path -> SHA256 (``SHA256SUMS`` included)."""
        with self._lock:
            self._releases[release] = dict(files)

    def sample(self) -> None:
        self.rounds += 1
        for slot in sorted(self._repository.glob(f"{self._model}*")):
            try:
                self._audit_dir(slot)
            except FileNotFoundError:
                continue  # retired or swapped while looking: it is not there to serve

    def _audit_dir(self, slot: Path) -> None:
        # The daemon moves whole dirs by rename (placing, swapping, retiring), atomically; a
        # walk that such a rename cut through saw no dir as it is, so it is not judged.
        # Whether one did is told by the dir's inode, the same before and after the walk.
        inode = slot.stat().st_ino
        found = self._faults(slot)
        if found and slot.stat().st_ino == inode:
            self.violations.extend(found)

    def _faults(self, slot: Path) -> list[str]:
        marker = slot / MARKER_NAME
        if not marker.exists():
            return []  # the alias ensemble (no release in it) or nothing placed yet
        release = str(json.loads(marker.read_text(encoding="utf-8"))["release"])
        with self._lock:
            expected = self._releases.get(release)
        if expected is None:
            return [f"{slot.name}: holds release {release!r} no test published"]
        self.placements_seen.add((slot.name, release))
        faults: list[str] = []
        seen: set[str] = set()
        for dirpath, _dirnames, filenames in os.walk(slot):
            for name in filenames:
                path = Path(dirpath) / name
                rel = path.relative_to(slot).as_posix()
                seen.add(rel)
                if rel in _ADDED_BY_STAGING or "__pycache__/" in rel or rel == "config.pbtxt":
                    continue
                if rel not in expected:
                    faults.append(f"{slot.name} ({release}): unexpected file {rel}")
                    continue
                info = path.stat()
                key = (info.st_ino, info.st_size, info.st_mtime_ns)
                if key not in self._hashed:
                    self._hashed[key] = _digest(path)
                if self._hashed[key] != expected[rel]:
                    faults.append(f"{slot.name} ({release}): {rel} does not match")
        if missing := sorted(set(expected) - seen):
            faults.append(f"{slot.name} ({release}): missing {missing}")
        return faults
