"""Walking a release's files on disk, refusing anything that is not a plain file or dir.

Shared by the local store (what to copy) and staging (what was written): a release is plain
files and dirs, never a symlink or a device that could point outside it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from controlplane.domain.errors import UnsafeRelease


def regular_files(root: Path) -> list[tuple[str, int]]:
    """Every regular file under ``root`` as (relative posix path, size), sorted."""
    found: list[tuple[str, int]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = path.lstat()
            rel = path.relative_to(root).as_posix()
            if stat.S_ISLNK(info.st_mode):
                raise UnsafeRelease(f"the release holds a symlink at {rel!r}; ship plain files")
            if stat.S_ISREG(info.st_mode):
                found.append((rel, info.st_size))
            elif not stat.S_ISDIR(info.st_mode):
                raise UnsafeRelease(f"the release holds a special file at {rel!r}")
    return sorted(found)
