"""What a placed dir's files are, in one digest that costs a stat per file to check.

A dir the daemon placed is recorded as a release; a file edited in it by hand afterwards (a
debugging session on a node, a config "fixed" in place) would be served, and reported, as
that release. Hashing the files at every look would cost as much as the model is big, so the
marker written at placement keeps a digest of each file's path, inode, size and mtime, and a
look compares it with the files as they are now. An edit in place moves the mtime, a file
replaced or added changes the list; the ``__pycache__`` dirs are left out (Triton's Python
backend may write one for its own Python version after the load), as is the marker itself.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

SKIPPED_DIRS = frozenset({"__pycache__"})


def fingerprint(root: Path, *, skip: frozenset[str]) -> str:
    """The digest of every regular file under ``root`` but the names in ``skip``."""
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            path = os.path.join(folder, name)
            if name in skip and folder == str(root):
                continue
            seen = os.lstat(path)
            relative = os.path.relpath(path, root)
            digest.update(
                f"{relative}\0{seen.st_ino}\0{seen.st_size}\0{seen.st_mtime_ns}\n".encode()
            )
    return digest.hexdigest()
