"""The time seam: every use case and loop reads time and waits through a :class:`Clock`, so
unit tests drive them on fake time.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol


class Clock(Protocol):
    """Time, for every use case and loop: what time it is, and waiting for time to pass
    (:mod:`controlplane.timing` builds every wait on :meth:`sleep`)."""

    def now(self) -> datetime:
        """Wall-clock time, timezone-aware UTC."""
        ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock (at once for 0 or less, after
        letting other tasks run)."""
        ...
