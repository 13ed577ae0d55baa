"""The GPU plot: utilisation against the threshold over the history's span, rollbacks marked,
as inline SVG rendered here (no chart library, no script).

Time runs left to right from ``since`` to ``until``; utilisation (a ratio) bottom to top from 0
to 1, values above 1 drawn at the top. A sample that could not be read breaks the line rather
than being drawn as 0: a gap in the data is not an idle GPU. Without a single sample the plot
still draws its frame, the threshold and the rollbacks, and says ``no GPU samples`` and why.
Each rollback is a vertical line at its time with a ``<title>`` (what, from, to, why) that a
browser shows on hover.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from controlplane.api.page.markup import esc, percent
from controlplane.domain.rollback import RollbackRecord
from controlplane.services.overload import GpuPoint
from controlplane.services.overview import GpuHistory

WIDTH, HEIGHT = 520, 150
LEFT, RIGHT, TOP, BOTTOM = 40, 10, 10, 22  # margins around the plotting area
INNER_W, INNER_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
NO_SAMPLES = "no GPU samples"


def gpu_plot(history: GpuHistory, rollbacks: Sequence[RollbackRecord], model: str) -> str:
    span = (history.until - history.since).total_seconds() or 1.0

    def x(at: datetime) -> float:
        offset = (at - history.since).total_seconds() / span
        return LEFT + min(max(offset, 0.0), 1.0) * INNER_W

    marks = [r for r in rollbacks if history.since <= r.at <= history.until]
    samples = sum(1 for p in history.points if p.value is not None)
    label = (
        f"GPU utilisation of the last {span / 60:.0f} min for {model}: {samples} samples"
        + (f", threshold {percent(history.threshold)}" if history.threshold is not None else "")
        + f", {len(marks)} rollback(s)"
    )
    return "".join(
        [
            f'<svg class="gpu-plot" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
            f'height="{HEIGHT}" data-samples="{samples}" data-rollbacks="{len(marks)}" '
            f'aria-label="{esc(label)}">',
            f"<title>{esc(label)}</title>",
            f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{INNER_W}" height="{INNER_H}" '
            'fill="#fafafa" stroke="#bbb"/>',
            *_axes(history, _y),
            *_threshold(history.threshold),
            *(_samples(run, x) for run in _runs(history.points)),
            *(_rollback_mark(record, x(record.at)) for record in marks),
            *([] if history.sampled else _no_samples(history.note)),
            "</svg>",
        ]
    )


def _y(ratio: float) -> float:
    return TOP + (1.0 - min(max(ratio, 0.0), 1.0)) * INNER_H


def _threshold(threshold: float | None) -> list[str]:
    """The threshold as a dashed line across the plot, labelled at its right end."""
    if threshold is None:
        return []
    level = _y(threshold)
    return [
        f'<line class="threshold" x1="{LEFT}" y1="{level:.1f}" x2="{LEFT + INNER_W}" '
        f'y2="{level:.1f}" stroke="#c62828" stroke-width="1.5" stroke-dasharray="6 4"/>',
        f'<text x="{LEFT + INNER_W - 4}" y="{level - 4:.1f}" text-anchor="end" '
        f'font-size="10" fill="#c62828">threshold {esc(percent(threshold))}</text>',
    ]


def _samples(run: list[tuple[datetime, float]], x: Callable[[datetime], float]) -> str:
    """One run of samples: a line, or a dot when the run is a single sample."""
    if len(run) == 1:
        (at, value) = run[0]
        return (
            f'<circle class="sample" cx="{x(at):.1f}" cy="{_y(value):.1f}" r="2" fill="#1565c0"/>'
        )
    path = " ".join(f"{x(at):.1f},{_y(value):.1f}" for at, value in run)
    return (
        f'<polyline class="samples" points="{path}" fill="none" stroke="#1565c0" '
        'stroke-width="1.5"/>'
    )


def _rollback_mark(record: RollbackRecord, where: float) -> str:
    """A rollback: a vertical line at its time, labelled, with what it did as its title."""
    title = (
        f"rollback at {record.at:%H:%M:%S} UTC: {record.from_release or '-'} -> "
        f"{record.to_release or '-'} ({record.outcome.value}; {record.trigger.value}: "
        f"{record.reason})"
    )
    return (
        f'<g class="rollback-mark" data-at="{esc(record.at.isoformat())}">'
        f"<title>{esc(title)}</title>"
        f'<line x1="{where:.1f}" y1="{TOP}" x2="{where:.1f}" y2="{TOP + INNER_H}" '
        'stroke="#ef6c00" stroke-width="2"/>'
        f'<text {_beside(where)} y="{TOP + INNER_H - 4}" font-size="10" fill="#ef6c00">'
        "rollback</text></g>"
    )


def _no_samples(note: str) -> list[str]:
    """Said in the middle of a plot without a single sample, with why."""
    middle = TOP + INNER_H / 2
    return [
        f'<text class="no-samples" x="{LEFT + INNER_W / 2}" y="{middle:.1f}" '
        f'text-anchor="middle" font-size="14" fill="#555">{NO_SAMPLES}</text>',
        f'<text x="{LEFT + INNER_W / 2}" y="{middle + 16:.1f}" text-anchor="middle" '
        f'font-size="10" fill="#777">{esc(note)}</text>',
    ]


def _axes(history: GpuHistory, y: Callable[[float], float]) -> list[str]:
    parts = []
    for ratio in (0.0, 0.5, 1.0):
        level = y(ratio)
        parts.append(
            f'<text x="{LEFT - 4}" y="{level + 3:.1f}" text-anchor="end" font-size="10" '
            f'fill="#555">{percent(ratio)}</text>'
        )
    minutes = (history.until - history.since).total_seconds() / 60
    base = HEIGHT - 6
    parts.append(
        f'<text x="{LEFT}" y="{base}" font-size="10" fill="#555">-{minutes:.0f} min</text>'
    )
    parts.append(
        f'<text x="{LEFT + INNER_W}" y="{base}" text-anchor="end" font-size="10" '
        f'fill="#555">now ({history.until:%H:%M:%S} UTC)</text>'
    )
    return parts


def _beside(where: float) -> str:
    """Where a rollback's label goes: right of its line, or left of it near the right edge."""
    if where > LEFT + INNER_W - 50:
        return f'x="{where - 3:.1f}" text-anchor="end"'
    return f'x="{where + 3:.1f}"'


def _runs(points: Sequence[GpuPoint]) -> list[list[tuple[datetime, float]]]:
    """The samples in runs without a missing value: each run is drawn as one line."""
    runs: list[list[tuple[datetime, float]]] = [[]]
    for point in points:
        if point.value is None:
            if runs[-1]:
                runs.append([])
            continue
        runs[-1].append((point.at, point.value))
    return [run for run in runs if run]
