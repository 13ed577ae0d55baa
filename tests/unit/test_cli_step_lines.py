"""The lines `deploy --wait` prints per step: what a step found, in a few words."""

from __future__ import annotations

from controlplane.cli.fleet import fleet_table
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


def test_a_members_error_with_a_traceback_keeps_the_fleet_table_one_line_per_member() -> None:
    """Found from outside: a model whose initialize() raised put its traceback, newlines and
    all, into the MEMBER table."""
    error = 'load failed: Traceback (most recent call last):\n  File "model.py"\nRuntimeError: x'
    data = {
        "member": "a",
        "members": [
            {
                "member": "a",
                "alive": True,
                "last_seen": "2026-12-03T06:00:00+00:00",
                "models": {"m": {"release": "r1", "state": "failed", "error": error}},
            }
        ],
        "models": {},
        "unreadable_records": [{"record": "x", "error": "bad\nrecord"}],
    }

    lines = fleet_table(data)

    assert all("\n" not in line for line in lines)
    [row] = [line for line in lines if line.startswith("a ")]
    assert row.endswith('Traceback (most recent call last): File "model.py" RuntimeError: x')
