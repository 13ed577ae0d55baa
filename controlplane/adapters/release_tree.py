"""Walking a release's files on disk, refusing anything that is not a plain file or dir, and
telling whether they changed since they were placed.

Shared by the local store (what to copy) and staging (what was written): a release is plain
files and dirs, never a symlink or a device that could point outside it.

A dir the daemon placed is recorded as a release; a file edited in it by hand afterwards (a
debugging session on a node, a config "fixed" in place) would be served, and reported, as that
release. Hashing the files at every look would cost as much as the model is big, so the marker
written at placement keeps :func:`fingerprint`, a digest of each file's path, inode, size and
mtime, and a look compares it with the files as they are now: an edit in place moves the mtime,
a file or dir replaced or added changes the list. The ``__pycache__`` dirs are left out (Triton's
Python backend may write one for its own Python version after the load).
"""

from __future__ import annotations

import hashlib
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


def fingerprint(root: Path, *, skip: frozenset[str]) -> str:
    """The digest of every file under ``root`` (but ``skip``, names at its top, and
    ``__pycache__`` dirs) by path, inode, size and mtime, and of every dir by its path."""
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in dirs:  # a dir added (a version Triton would load) is a change too
            digest.update(f"{os.path.relpath(os.path.join(folder, name), root)}/\n".encode())
        for name in sorted(files):
            if name in skip and folder == str(root):
                continue
            path = os.path.join(folder, name)
            seen = os.lstat(path)
            relative = os.path.relpath(path, root)
            digest.update(
                f"{relative}\0{seen.st_ino}\0{seen.st_size}\0{seen.st_mtime_ns}\n".encode()
            )
    return digest.hexdigest()
