"""Reading a small file that must not be big: at most ``limit + 1`` bytes, sized by the file.

``stream.read(limit + 1)`` allocates ``limit + 1`` bytes before it reads a byte: 16 MiB for each
``SHA256SUMS`` of a few hundred bytes (the cap a manifest may reach), freed again at once. Every
marker hashed (4,000 at a first scan of 200 models x 20 releases) paid for a 16 MiB allocation,
and each fleet record read every poll interval for a 1 MiB one. Here the read is sized by the
file's own size, and a file that grew since its stat is read on, up to the same bound.
"""

from __future__ import annotations

import os
from typing import BinaryIO


def read_at_most(stream: BinaryIO, limit: int) -> bytes:
    """The file's bytes, at most ``limit + 1`` of them (one more than allowed tells a file too
    big), whatever its size."""
    size = os.fstat(stream.fileno()).st_size
    data = stream.read(min(size, limit) + 1)
    if len(data) <= size or len(data) > limit:
        return data  # all of it (or already too much)
    return data + stream.read(limit + 1 - len(data))  # it grew since the stat: read on
