"""Releases as the store reports them, their natural ordering (``r2`` < ``r10``), and the
floor under them (``min_release``): the oldest release of a model that may serve."""

from __future__ import annotations

import re
from dataclasses import dataclass

from controlplane.domain.errors import ReleaseBelowFloor

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders digit runs by value: ``v2`` before ``v10``."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part.lower())
        for part in _DIGITS.split(name)
        if part
    )


def below_floor(release: str, floor: str | None) -> bool:
    """Whether ``release`` sorts before ``floor`` in the natural order (the order in which the
    watcher finds the newest release); a release equal to the floor is not below it."""
    return floor is not None and natural_key(release) < natural_key(floor)


def check_floor(model: str, release: str, floor: str | None) -> None:
    """Refuse ``release`` of ``model`` when it sorts before ``floor`` (``min_release``)."""
    if below_floor(release, floor):
        raise ReleaseBelowFloor(
            f"release {release!r} of {model!r} sorts before the model's min_release {floor!r} "
            f"(natural order of release names): releases older than {floor} may not serve, so "
            "it is refused and what serves keeps serving. Deploy a release at or above the "
            "floor, or lower min_release if this one must serve again",
            details={"model": model, "release": release, "min_release": floor},
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
