"""The stress preflight's arithmetic: phases, percentiles, and the verdict a user reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from controlplane.domain.stress import (
    ACTIVE,
    NEW,
    Growth,
    Load,
    SlotFigures,
    StressPolicy,
    judge,
    percentile,
    phases,
)
from controlplane.settings import SettingsError, load_settings

MIB = 1024**2
POLICY = StressPolicy(enabled=True, seconds=2.0, concurrency=4, max_p99_ratio=2.0)


def figures(
    slot: str, latencies: list[float], errors: int = 0, first: str | None = None
) -> SlotFigures:
    return SlotFigures.of(slot, Load(tuple(latencies), errors, first))


def no_growth() -> list[Growth]:
    return [Growth("shm", "shared memory (/dev/shm)", 10 * MIB, 10 * MIB)]


def test_phases_alternate_new_and_active_and_fill_the_window() -> None:
    window = phases(3.0, with_active=True)
    assert [role for role, _ in window] == [NEW, ACTIVE] * 3
    assert sum(seconds for _, seconds in window) == pytest.approx(3.0)
    odd = phases(1.4, with_active=True)  # 3 phases of 0.5 s rounded up to an even count
    assert [role for role, _ in odd] == [NEW, ACTIVE, NEW, ACTIVE]
    assert sum(seconds for _, seconds in odd) == pytest.approx(1.4)


def test_without_an_active_slot_every_phase_is_the_new_slot() -> None:
    assert {role for role, _ in phases(2.0, with_active=False)} == {NEW}


def test_nearest_rank_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 99) is None


def test_loads_add_up_and_keep_the_first_error() -> None:
    total = Load((1.0,), 0, None) + Load((2.0,), 2, "boom") + Load((), 1, "later")
    assert total == Load((1.0, 2.0), 3, "boom")


def test_a_slow_new_slot_is_refused_with_both_p99s_and_the_ratio() -> None:
    verdict = judge(
        POLICY, figures("m__green", [180.0] * 100), figures("m__blue", [12.0] * 100), no_growth()
    )

    assert not verdict.ok
    assert verdict.describe() == (
        "p99 180 ms on the new slot vs 12 ms on the serving one (ratio 15.0 > 2.0, max_p99_ratio; "
        "p50 180 ms vs 12 ms, 100 vs 100 requests at concurrency 4)"
    )
    detail = verdict.as_detail()
    assert detail["p99_ratio"] == 15.0
    assert detail["verdict"] == "refused"
    assert detail["new"] == {
        "slot": "m__green",
        "requests": 100,
        "errors": 0,
        "error_rate": 0.0,
        "p50_ms": 180.0,
        "p99_ms": 180.0,
        "first_error": None,
    }


def test_a_p99_within_the_ratio_passes() -> None:
    verdict = judge(POLICY, figures("n", [3.9] * 50), figures("a", [2.0] * 50), no_growth())
    assert verdict.ok, verdict.describe()
    assert verdict.as_detail()["verdict"] == "passed"


def test_a_p99_slower_by_less_than_the_gap_is_noise_not_a_refusal() -> None:
    # 3x slower, but by 4 ms: what a busy host does to a fast model's p99.
    verdict = judge(POLICY, figures("n", [6.0] * 50), figures("a", [2.0] * 50), no_growth())
    assert verdict.ok, verdict.describe()
    strict = StressPolicy(enabled=True, min_p99_gap_ms=0.0)
    assert not judge(strict, figures("n", [6.0] * 50), figures("a", [2.0] * 50), no_growth()).ok


def test_any_error_refuses_and_names_the_first() -> None:
    verdict = judge(POLICY, figures("n", [1.0] * 99, errors=1, first="boom"), None, no_growth())
    assert verdict.problems == (
        "1 of 100 requests to the new slot failed (error rate 1.0%); the first: boom",
    )


def test_a_first_deploy_compares_no_latency_and_says_so() -> None:
    verdict = judge(POLICY, figures("n", [500.0] * 10), None, no_growth())
    assert verdict.ok
    assert verdict.p99_ratio is None
    assert verdict.as_detail()["active"] == "none: a first deploy, latency not compared"


def test_memory_growth_beyond_the_bound_refuses_and_unreadable_figures_do_not() -> None:
    growth = [
        Growth("shm", "shared memory (/dev/shm)", 10 * MIB, 90 * MIB),
        Growth("gpu_memory", "GPU memory", None, None),
    ]
    verdict = judge(POLICY, figures("n", [1.0] * 10), None, growth)
    assert verdict.problems == (
        "shared memory (/dev/shm) grew by 80.0 MiB during the 2 s window (10.0 MiB -> 90.0 MiB "
        "used; max_memory_growth_bytes 64.0 MiB)",
    )
    detail = verdict.as_detail()
    assert detail["gpu_memory"] == "unreadable"
    assert detail["shm"] == {
        "before_bytes": 10 * MIB,
        "after_bytes": 90 * MIB,
        "grew_bytes": 80 * MIB,
    }


def test_growth_up_to_the_bound_passes() -> None:
    growth = [Growth("shm", "shared memory (/dev/shm)", 0, 64 * MIB)]
    assert judge(POLICY, figures("n", [1.0]), None, growth).ok


def test_a_new_slot_that_answered_nothing_is_refused() -> None:
    assert not judge(POLICY, figures("n", []), None, no_growth()).ok


def test_stress_with_the_inplace_strategy_is_refused_at_start_up(tmp_path: Path) -> None:
    config = tmp_path / "controlplane.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "repository": {"path": str(tmp_path / "repository")},
                "store": {"uri": (tmp_path / "store").as_uri()},
                "models": {
                    "ocr": {"strategy": "inplace", "preflight": {"stress": {"enabled": True}}}
                },
            }
        ),
        encoding="utf-8",
    )
    with pytest.raises(SettingsError) as caught:
        load_settings(config)
    assert "preflight.stress.enabled needs strategy blue-green" in str(caught.value)
    assert "models.ocr" in str(caught.value)


def test_per_model_stress_settings_reach_the_policy(tmp_path: Path) -> None:
    config = tmp_path / "controlplane.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "repository": {"path": str(tmp_path / "repository")},
                "store": {"uri": (tmp_path / "store").as_uri()},
                "models": {"resnet": {"preflight": {"stress": {"enabled": True, "seconds": 3}}}},
            }
        ),
        encoding="utf-8",
    )
    settings = load_settings(config)
    assert settings.stress("resnet") == StressPolicy(enabled=True, seconds=3.0)
    assert settings.stress("other") == StressPolicy()
