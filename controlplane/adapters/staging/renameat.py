"""``renameat2(2)`` through ctypes: the two rename flavours placement needs.

``RENAME_EXCHANGE`` swaps two existing paths in one step, so a model dir is replaced without a
moment where it is missing or half there; ``RENAME_NOREPLACE`` places a new dir without ever
clobbering one that appeared meanwhile. Both need Linux >= 3.15 and one filesystem.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import uuid
from pathlib import Path

AT_FDCWD = -100
RENAME_NOREPLACE = 1 << 0
RENAME_EXCHANGE = 1 << 1

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_renameat2 = _libc.renameat2
_renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
_renameat2.restype = ctypes.c_int


def _call(source: Path, target: Path, flags: int) -> None:
    result = _renameat2(AT_FDCWD, os.fsencode(source), AT_FDCWD, os.fsencode(target), flags)
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"renameat2: {os.strerror(code)}", str(source), None, str(target))


def exchange(a: Path, b: Path) -> None:
    """Atomically swap two existing paths."""
    _call(a, b, RENAME_EXCHANGE)


def rename_noreplace(source: Path, target: Path) -> None:
    """Rename, failing with EEXIST instead of replacing an existing ``target``."""
    _call(source, target, RENAME_NOREPLACE)


def supported(probe_dir: Path) -> bool:
    """Whether this kernel and filesystem support ``RENAME_EXCHANGE`` under ``probe_dir``."""
    tag = uuid.uuid4().hex  # unique: a probe left by a killed start-up never gets in the way
    a = probe_dir / f".renameat2-probe-{tag}-a"
    b = probe_dir / f".renameat2-probe-{tag}-b"
    try:
        a.mkdir()
        b.mkdir()
        exchange(a, b)
        return True
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            return False
        raise
    finally:
        for path in (a, b):
            if path.is_dir():
                path.rmdir()
