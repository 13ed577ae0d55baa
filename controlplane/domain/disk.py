"""Room for a fetch: the release's size against its bound and the staging filesystem's space.

Decided before the first byte is written, from the sizes the store lists (a stat, a
ListObjectsV2), so a release can never fill the disk: a sparse 100 GB file is refused by its
apparent size, not discovered 3 GB into a dense copy. Files the content cache already holds
are hardlinked into staging and cost no space, so only the rest counts against free space.
A margin stays free for what else writes to that filesystem (the database, Triton, the
bytecode and marker staging adds).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from controlplane.domain.errors import InsufficientDisk, ReleaseTooLarge

MARGIN_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class DiskFigures:
    bytes_total: int  # every file the fetch stages, cached or not
    bytes_cached: int  # of those, what the content cache links in for free
    bytes_free: int  # free (for this user) on the staging filesystem
    max_release_bytes: int | None
    margin: int = MARGIN_BYTES

    @property
    def bytes_needed(self) -> int:
        """What the fetch writes: the files the cache does not hold."""
        return self.bytes_total - self.bytes_cached

    def detail(self) -> dict[str, object]:
        return {
            "bytes_total": self.bytes_total,
            "bytes_cached": self.bytes_cached,
            "bytes_needed": self.bytes_needed,
            "bytes_free": self.bytes_free,
            "margin_bytes": self.margin,
            "max_release_bytes": self.max_release_bytes,
        }

    def check(self) -> None:
        """:class:`ReleaseTooLarge` over the bound, :class:`InsufficientDisk` when the fetch
        would not fit with the margin left free."""
        bound = self.max_release_bytes
        if bound is not None and self.bytes_total > bound:
            raise ReleaseTooLarge(
                f"the release is {size_text(self.bytes_total)}, over store.max_release_bytes "
                f"({size_text(bound)}); publish a smaller release or raise the bound",
                details=self.detail(),
            )
        if self.bytes_needed + self.margin > self.bytes_free:
            cached = (
                f"{size_text(self.bytes_cached)} of the release's {size_text(self.bytes_total)} "
                "are in the content cache and cost nothing"
                if self.bytes_cached
                else "none of it is in the content cache"
            )
            raise InsufficientDisk(
                f"the fetch needs {size_text(self.bytes_needed)} in staging (and keeps "
                f"{size_text(self.margin)} free) but its filesystem has "
                f"{size_text(self.bytes_free)} free; {cached}. Free space on the repository's "
                "filesystem, or lower staging.cache_max_bytes",
                details=self.detail(),
            )


def room_for(
    sizes: Mapping[str, int],
    cached: Collection[str],
    *,
    free: int,
    max_release_bytes: int | None,
    margin: int = MARGIN_BYTES,
) -> DiskFigures:
    """The figures for staging the files ``sizes`` (path -> bytes) with ``cached`` of them
    linked from the content cache; :meth:`DiskFigures.check` says whether they fit."""
    return DiskFigures(
        bytes_total=sum(sizes.values()),
        bytes_cached=sum(size for rel, size in sizes.items() if rel in cached),
        bytes_free=free,
        max_release_bytes=max_release_bytes,
        margin=margin,
    )


def size_text(n: int) -> str:
    """``n`` bytes for a message: ``512 B``, ``3.2 MiB``, ``1.5 TiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
