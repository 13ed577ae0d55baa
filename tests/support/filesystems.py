"""A directory on a second filesystem, to test that placement refuses to span two.

/dev/shm (tmpfs) is a different filesystem from the one pytest's temp dirs live on, here and
in CI. The skip is for machines without one; in CI (``CI`` set) a missing one is a failure,
so the check is never silently skipped there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def other_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A fresh dir (not created) on a filesystem other than ``tmp_path``'s."""
    shm = Path("/dev/shm")
    usable = (
        shm.is_dir() and os.access(shm, os.W_OK) and shm.stat().st_dev != tmp_path.stat().st_dev
    )
    if not usable:
        if os.environ.get("CI"):
            pytest.fail("CI must provide a writable /dev/shm on another filesystem than /tmp")
        pytest.skip("no second filesystem (/dev/shm) beside tmp_path")
    path = shm / f"controlplane-test-{os.getpid()}-{tmp_path.name}"
    yield path
    shutil.rmtree(path, ignore_errors=True)
