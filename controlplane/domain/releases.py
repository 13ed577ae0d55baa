"""Releases as the store reports them, and their natural ordering (``r2`` < ``r10``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders digit runs by value: ``v2`` before ``v10``."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part.lower())
        for part in _DIGITS.split(name)
        if part
    )


@dataclass(frozen=True, slots=True)  # slots: a watcher holds one per release in the store
class ReleaseInfo:
    """A release in the store. ``complete`` means its ``SHA256SUMS`` commit marker exists.

    ``revision`` identifies the marker's content (an S3 ETag, a local mtime), so a release that
    is republished under the same name is seen as new. ``signed``: a ``SHA256SUMS.sig`` is
    published beside the marker (whether it verifies is for a deploy to find out).
    """

    model: str
    name: str
    complete: bool
    revision: str | None = None
    signed: bool = False
