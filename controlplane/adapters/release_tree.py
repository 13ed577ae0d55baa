"""Walking a release's files on disk, refusing anything that is not a plain file or dir, and
telling whether they changed since they were placed.

Shared by the local store (what to copy) and staging (what was written): a release is plain
files and dirs, never a symlink or a device that could point outside it.

A dir the daemon placed is recorded as a release; a file edited in it by hand afterwards (a
debugging session on a node, a config "fixed" in place) would be served, and reported, as that
release. Hashing the files at every look would cost as much as the model is big, so the marker
written at placement keeps :func:`fingerprint`: the files placed, a digest of their paths,
inodes, sizes and mtimes, and the version dirs. A look (:func:`changed`) compares them with
the files as they are now: an edit in place moves the mtime, a file replaced or removed
changes its inode or fails its stat, a version dir added is one Triton would load. Files a
model writes itself beside them (an engine cache, at its load) are not a change, or such a
model would be placed again at every pass; nor are ``__pycache__`` dirs (Triton's Python
backend may write one for its own Python version).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from controlplane.domain.checksums import FileDigest
from controlplane.domain.errors import UnsafeRelease

_CHUNK = 1024 * 1024


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


def digests(root: Path, *, skip: frozenset[str] = frozenset()) -> dict[str, FileDigest]:
    """Every regular file under ``root`` but ``skip`` (names at its top), hashed: what a
    publisher's ``SHA256SUMS`` lists. Symlinks and special files are refused, as above."""
    found = {}
    for rel, _size in regular_files(root):
        if rel in skip:
            continue
        sha = hashlib.sha256()
        size = 0
        with (root / rel).open("rb") as stream:
            while chunk := stream.read(_CHUNK):
                sha.update(chunk)
                size += len(chunk)
        found[rel] = FileDigest(size=size, sha256=sha.hexdigest())
    return found


def fingerprint(root: Path, *, skip: frozenset[str]) -> dict[str, object]:
    """What :func:`changed` compares later: the files placed under ``root`` (but ``skip``,
    names at its top, and ``__pycache__`` dirs) and the digest of their stats, and the
    version dirs at its top."""
    paths = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not (name in skip and folder == str(root)):
                paths.append(os.path.relpath(os.path.join(folder, name), root))
    return {"paths": paths, "digest": _stats(root, paths), "versions": _versions(root)}


def changed(root: Path, placed: object) -> bool:
    """Whether the files :func:`fingerprint` found (``placed``) changed since: one edited,
    replaced or removed, or a version dir added or removed at the top. Files the model writes
    itself beside them (an engine cache at its load) are not a change; a fingerprint of
    another shape (a marker from before) tells nothing, so is none."""
    if not isinstance(placed, dict) or not isinstance(paths := placed.get("paths"), list):
        return False
    try:
        now = _stats(root, [str(p) for p in paths])
    except OSError:  # a placed file is gone
        return True
    return now != placed.get("digest") or _versions(root) != placed.get("versions")


def _stats(root: Path, paths: list[str]) -> str:
    digest = hashlib.sha256()
    for relative in paths:
        seen = os.lstat(root / relative)
        digest.update(f"{relative}\0{seen.st_ino}\0{seen.st_size}\0{seen.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _versions(root: Path) -> list[str]:
    """The version dirs Triton would load from ``root``: its dirs named by a number."""
    return sorted(e.name for e in os.scandir(root) if e.is_dir() and e.name.isdigit())
