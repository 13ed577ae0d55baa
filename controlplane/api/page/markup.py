"""The small vocabulary every part of the page is written in: escaping, times, durations.

Everything that comes from outside the daemon (model and release names, members, reasons,
error messages, Triton's words) reaches the HTML through :func:`esc` and nothing else: the
page builds strings, so one escaping function is the whole defence against markup injection.
"""

from __future__ import annotations

import html
from datetime import datetime


def esc(value: object) -> str:
    """``value`` as text safe in an element and in a quoted attribute."""
    return html.escape(str(value), quote=True)


def text_or(value: str | None, missing: str = "-") -> str:
    """Escaped ``value``, or a dimmed ``missing`` when there is none."""
    if value is None or value == "":
        return f'<span class="none">{esc(missing)}</span>'
    return esc(value)


def clock(at: datetime, now: datetime) -> str:
    """A ``<time>`` element: the time of day (UTC) on ``now``'s day, the date too before it."""
    shown = at.strftime("%H:%M:%S") if at.date() == now.date() else at.strftime("%Y-%m-%d %H:%M")
    return f'<time datetime="{esc(at.isoformat())}">{esc(shown)}</time>'


def seconds(value: float | None) -> str:
    """A duration as people read it: ms under a second, s under two minutes, then min."""
    if value is None:
        return "running"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min"


def percent(ratio: float) -> str:
    return f"{ratio * 100:.0f}%"
