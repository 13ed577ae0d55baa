"""The lines `deploy --wait` prints per step: what a step found, in a few words."""

from __future__ import annotations

from controlplane.cli.follow import step_line


def test_a_stress_step_shows_the_new_slots_figures_beside_the_serving_ones() -> None:
    step = {
        "name": "stress",
        "status": "succeeded",
        "duration_seconds": 2.0,
        "detail": {
            "new": {"requests": 120, "errors": 0, "p99_ms": 21.46},
            "active": {"requests": 118, "errors": 0, "p99_ms": 20.0},
        },
    }
    assert step_line(step) == (
        "  ok  stress     2000.0 ms  120 requests, 0 errors, p99 21.5 ms vs 20.0 ms serving"
    )


def test_a_first_deploys_stress_step_has_no_serving_slot_to_compare() -> None:
    step = {
        "name": "stress",
        "status": "succeeded",
        "duration_seconds": 1.5,
        "detail": {"new": {"requests": 80, "errors": 0, "p99_ms": 9.0}, "active": "none"},
    }
    assert step_line(step).endswith("80 requests, 0 errors, p99 9.0 ms")


def test_a_fetch_step_shows_files_and_bytes() -> None:
    step = {
        "name": "fetch",
        "status": "succeeded",
        "duration_seconds": 0.0075,
        "detail": {"files": 3, "bytes": 1885},
    }
    assert step_line(step) == "  ok  fetch         7.5 ms  3 files, 1885 bytes"
