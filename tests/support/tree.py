"""Snapshots of directory trees, to assert that something changed nothing."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def snapshot(root: Path) -> dict[str, str]:
    """`{relative path: sha256 of content or 'dir'}` for everything under `root`."""
    found: dict[str, str] = {}
    if not root.exists():
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            found[(Path(dirpath) / name).relative_to(root).as_posix()] = "dir"
        for name in filenames:
            path = Path(dirpath) / name
            found[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found
