"""The overload evaluator: pure logic from timed samples to a verdict.

``breach``  every sample in the last ``window`` seconds is above ``threshold`` and the samples
            cover the window: one at or before its start, and no gap longer than twice the
            scrape interval;
``healthy`` a sample in the window is at or below the threshold;
``unknown`` no data, stale data, scrape errors, or a gap with nothing but high samples: hold,
            report, never act.

``unknown`` never triggers anything by itself: a monitoring outage must not roll a model back.
Several GPUs are combined per scrape first (``any``: the hottest, ``all``: the coolest,
``mean``). Times are seconds on any one clock; values are ratios in [0, 1], as Triton exports
``nv_gpu_utilization``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum


class Verdict(StrEnum):
    BREACH = "breach"
    HEALTHY = "healthy"
    UNKNOWN = "unknown"


class Aggregate(StrEnum):
    ANY = "any"
    ALL = "all"
    MEAN = "mean"


@dataclass(frozen=True)
class Sample:
    at: float
    value: float | None  # None: the scrape failed or the metric was missing


@dataclass(frozen=True)
class EvaluatorConfig:
    threshold: float = 0.95
    window: float = 10.0
    interval: float = 1.0
    jitter: float = 0.05  # how late a sample on the beat may land and still open the window

    @property
    def max_gap(self) -> float:
        return 2 * self.interval


@dataclass(frozen=True)
class Evaluation:
    verdict: Verdict
    reason: str
    covered_from: float | None = None
    covered_to: float | None = None
    samples: int = 0

    @property
    def covered_seconds(self) -> float:
        if self.covered_from is None or self.covered_to is None:
            return 0.0
        return self.covered_to - self.covered_from


def check_threshold(threshold: float, *, unit: str = "ratio") -> float:
    """Refuse a threshold that cannot mean what it says for the metric's unit."""
    if unit == "percent":
        if not 1.0 < threshold <= 100.0:
            raise ValueError(
                f"threshold {threshold:g} is outside (1, 100], but the unit is percent; "
                f"for 95 % use 95 (or unit ratio with {threshold:g})"
            )
        return threshold
    if unit == "ratio" and not 0.0 < threshold <= 1.0:
        hint = (
            f" ({threshold:g} looks like a percentage: use {threshold / 100:g})"
            if (1.0 < threshold <= 100.0)
            else ""
        )
        raise ValueError(
            f"threshold {threshold:g} is outside (0, 1], but the metric is a ratio in [0, 1]"
            f"{hint}; for 95 % use 0.95"
        )
    return threshold


def combine(per_gpu: Mapping[str, float], how: Aggregate) -> float | None:
    """One value per scrape from several GPUs; None when there are none."""
    values = list(per_gpu.values())
    if not values:
        return None
    if how is Aggregate.ANY:
        return max(values)
    if how is Aggregate.ALL:
        return min(values)
    return statistics.fmean(values)


def evaluate(samples: Sequence[Sample], now: float, config: EvaluatorConfig) -> Evaluation:
    start = now - config.window
    inside = sorted((s for s in samples if start < s.at <= now), key=lambda s: s.at)
    # The latest sample at or before the window's start (up to one gap before it) says what
    # the window began with; older ones say nothing about the window.
    before = [s for s in samples if start - config.max_gap < s.at <= start]
    lead = [max(before, key=lambda s: s.at)] if before else []
    relevant = lead + inside
    if not relevant:
        return Evaluation(Verdict.UNKNOWN, "no data in the window")
    first, last = relevant[0].at, relevant[-1].at

    def found(verdict: Verdict, reason: str) -> Evaluation:
        return Evaluation(verdict, reason, max(first, start), last, len(relevant))

    if now - last > config.max_gap:
        return found(Verdict.UNKNOWN, f"stale: last sample {now - last:.1f} s ago")
    if any(s.value is None for s in relevant):
        return found(Verdict.UNKNOWN, "samples missing in the window (failed reads or no GPU)")
    values = [s.value for s in relevant if s.value is not None]
    if any(value <= config.threshold for value in values):
        low = min(values)
        return found(Verdict.HEALTHY, f"a sample at {low:.3f} <= {config.threshold}")
    times = [s.at for s in relevant]
    gaps = [b - a for a, b in zip([start, *times], [*times, now], strict=True)]
    if max(gaps) > config.max_gap:
        return found(Verdict.UNKNOWN, f"a gap of {max(gaps):.1f} s in the data; holding")
    if first > start + config.jitter:
        # Above the line so far, but not yet for the whole window: no breach before it is.
        return found(Verdict.UNKNOWN, f"above {config.threshold} for {now - first:.1f} s so far")
    return found(Verdict.BREACH, f"every sample above {config.threshold} for {config.window:g} s")
