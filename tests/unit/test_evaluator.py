"""The overload evaluator: breach only when the whole window is covered and above threshold."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.evaluator import (
    Aggregate,
    EvaluatorConfig,
    Sample,
    Verdict,
    check_threshold,
    combine,
    evaluate,
)

CONFIG = EvaluatorConfig(threshold=0.95, window=10.0, interval=1.0)
NOW = 1000.0


def steady(value: float, seconds: int = 11, *, every: float = 1.0) -> list[Sample]:
    """One sample per interval over the last `seconds`, ending now."""
    count = int(seconds / every)
    return [Sample(NOW - i * every, value) for i in range(count, -1, -1)]


def test_held_above_the_threshold_for_the_window_is_a_breach() -> None:
    result = evaluate(steady(0.99), NOW, CONFIG)
    assert result.verdict is Verdict.BREACH
    assert result.covered_seconds == pytest.approx(10.0)


def test_a_dip_at_second_9_is_no_breach() -> None:
    samples = [Sample(s.at, 0.5 if s.at == NOW - 1 else s.value) for s in steady(0.99)]
    result = evaluate(samples, NOW, CONFIG)
    assert result.verdict is Verdict.HEALTHY
    assert "0.500" in result.reason


def test_a_gap_in_the_data_is_unknown() -> None:
    samples = [s for s in steady(0.99) if not NOW - 7 <= s.at <= NOW - 4]
    result = evaluate(samples, NOW, CONFIG)
    assert result.verdict is Verdict.UNKNOWN
    assert "gap" in result.reason


def test_data_that_starts_late_in_the_window_is_unknown() -> None:
    result = evaluate(steady(0.99, seconds=5), NOW, CONFIG)
    assert result.verdict is Verdict.UNKNOWN


def test_no_data_stale_data_and_scrape_errors_are_unknown() -> None:
    assert evaluate([], NOW, CONFIG).verdict is Verdict.UNKNOWN
    stale = [Sample(s.at - 30, s.value) for s in steady(0.99)]
    assert evaluate(stale, NOW, CONFIG).verdict is Verdict.UNKNOWN
    errors = [*steady(0.99)[:-1], Sample(NOW, None)]
    result = evaluate(errors, NOW, CONFIG)
    assert result.verdict is Verdict.UNKNOWN
    assert "samples missing" in result.reason


def test_a_percent_threshold_against_a_ratio_metric_is_refused() -> None:
    with pytest.raises(ValueError, match=r"use 0\.95"):
        check_threshold(95)
    with pytest.raises(ValueError, match="ratio"):
        check_threshold(0)
    assert check_threshold(0.95) == 0.95


def test_gpus_are_combined_per_scrape() -> None:
    gpus = {"GPU-a": 0.99, "GPU-b": 0.2}
    assert combine(gpus, Aggregate.ANY) == 0.99
    assert combine(gpus, Aggregate.ALL) == 0.2
    assert combine(gpus, Aggregate.MEAN) == pytest.approx(0.595)
    assert combine({}, Aggregate.ANY) is None


values = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@given(st.lists(values, min_size=11, max_size=11))
def test_a_window_with_any_sample_at_or_under_the_threshold_never_breaches(
    readings: list[float],
) -> None:
    samples = [Sample(NOW - 10 + i, value) for i, value in enumerate(readings)]
    result = evaluate(samples, NOW, CONFIG)
    if min(readings) <= CONFIG.threshold:
        assert result.verdict is Verdict.HEALTHY
    else:
        assert result.verdict is Verdict.BREACH


@given(
    st.lists(st.floats(min_value=0.951, max_value=1.0), min_size=1, max_size=40),
    st.lists(st.floats(min_value=0.0, max_value=12.0), min_size=1, max_size=40),
)
def test_only_a_covered_window_of_high_samples_breaches(
    readings: list[float], offsets: list[float]
) -> None:
    paired = list(zip(offsets, readings, strict=False))
    samples = [Sample(NOW - offset, value) for offset, value in paired]
    result = evaluate(samples, NOW, CONFIG)
    # Samples up to one gap before the window still count for it.
    start = NOW - CONFIG.window
    times = sorted({NOW - offset for offset, _ in paired if NOW - offset > start - CONFIG.max_gap})
    covered = (
        bool(times)
        and times[0] <= start + CONFIG.jitter  # a sample says what the window began with
        and all(b - a <= CONFIG.max_gap for a, b in itertools.pairwise([*times, NOW]))
    )
    assert result.verdict is (Verdict.BREACH if covered else Verdict.UNKNOWN)


def test_only_the_latest_sample_before_the_window_counts_for_it() -> None:
    # Low until 1.5 s before the window, high from 0.5 s before it: ten seconds above the line.
    start = NOW - CONFIG.window
    samples = [Sample(start - 1.5, 0.30)] + [
        Sample(start - 0.5 + i, 0.99) for i in range(int(CONFIG.window) + 1)
    ]
    assert evaluate(samples, NOW, CONFIG).verdict is Verdict.BREACH
    # One second earlier the window began before the first high sample: no breach yet.
    assert evaluate(samples[:-1], NOW - 1, CONFIG).verdict is Verdict.HEALTHY
