"""Disk space as a user sees it: what a dir really occupies, and releases that would fill it.

- :func:`bytes_on_disk` sums allocated blocks (``st_blocks``), not apparent sizes, so a sparse
  file counts for what it holds and a dense copy of it for all of it;
- :class:`PeakUsage` polls that in a thread while something else writes, and keeps the peak;
- :func:`add_sparse_file` adds a file with a huge apparent size and no blocks to a published
  release, listed in its ``SHA256SUMS`` or not.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.models import SHA256SUMS
from tests.support.sampling import Sampler

GIB = 1024**3


def bytes_on_disk(root: Path) -> int:
    """Bytes allocated to the files and dirs under ``root`` (0 when it does not exist)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:  # removed while walking: it holds nothing now
                continue
    return total


def free_bytes(path: Path) -> int:
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


def too_big_for(path: Path) -> int:
    """An apparent size no fetch into ``path``'s filesystem could hold: at least 100 GiB, and
    10 GiB more than is free there."""
    return max(100 * GIB, free_bytes(path) + 10 * GIB)


class PeakUsage(Sampler):
    """Poll :func:`bytes_on_disk` of ``root`` every ``every`` s in a thread; keep the peak."""

    def __init__(self, root: Path, every: float = 0.02) -> None:
        super().__init__(every, "peak-usage")
        self._root = root
        self.peak = 0
        self.samples = 0

    def sample(self) -> None:
        self.peak = max(self.peak, bytes_on_disk(self._root))
        self.samples += 1


def add_sparse_file(release_dir: Path, rel: str, size: int, *, listed: bool) -> Path:
    """Add ``rel`` to a published release: ``size`` bytes of apparent size, no blocks.

    ``listed`` adds it to ``SHA256SUMS`` (rewritten atomically, as a publisher would), with
    a digest that is not its own: hashing 100 GiB of holes would take minutes, and a deploy
    must refuse the release by its size before it reads a byte of it anyway.
    """
    path = release_dir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        out.truncate(size)
    if listed:
        sums = release_dir / SHA256SUMS
        tmp = release_dir / f".{SHA256SUMS}.tmp"
        tmp.write_text(sums.read_text(encoding="utf-8") + f"{'0' * 64}  {rel}\n", "utf-8")
        os.replace(tmp, sums)
    return path
