"""Operations: ordered, timed steps and an outcome, each change a new frozen value."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from controlplane.domain.operations import (
    Operation,
    OperationError,
    OperationKind,
    OperationStatus,
    Step,
    StepStatus,
    Trigger,
)

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def new_operation() -> Operation:
    return Operation(
        id="op-1",
        kind=OperationKind.DEPLOY,
        model="resnet",
        release="r2",
        trigger=Trigger.API,
        status=OperationStatus.PENDING,
        created_at=T0,
        from_release="r1",
    )


def test_a_new_operation_is_pending_without_duration() -> None:
    op = new_operation()
    assert op.status is OperationStatus.PENDING
    assert not op.status.finished
    assert op.duration_seconds is None
    assert op.steps == ()
    assert op.error is None


def test_steps_are_ordered_and_timed() -> None:
    op = new_operation().running()
    op = op.start_step("fetch", at(1)).finish_step(at(3.5), ok=True, detail={"bytes": 10})
    op = op.start_step("verify", at(4))
    assert [s.status for s in op.steps] == [StepStatus.SUCCEEDED, StepStatus.RUNNING]
    assert op.steps[1].duration_seconds is None
    op = op.finish_step(at(4.25), ok=False, detail={"why": "bad"})

    assert op.status is OperationStatus.RUNNING
    assert op.steps == (
        Step("fetch", StepStatus.SUCCEEDED, at(1), at(3.5), {"bytes": 10}),
        Step("verify", StepStatus.FAILED, at(4), at(4.25), {"why": "bad"}),
    )
    assert [s.duration_seconds for s in op.steps] == [2.5, 0.25]


def test_step_detail_accumulates() -> None:
    op = new_operation().start_step("fetch", at(0)).with_step_detail({"files": 2})
    op = op.finish_step(at(1), ok=True, detail={"bytes": 7})
    assert op.steps[0].detail == {"files": 2, "bytes": 7}


def test_step_detail_without_steps_is_a_no_op() -> None:
    op = new_operation()
    assert op.with_step_detail({"x": 1}) is op


def test_operation_detail_merges() -> None:
    op = new_operation().with_detail({"a": 1}).with_detail({"b": 2})
    assert op.detail == {"a": 1, "b": 2}


def test_changes_return_new_values_and_leave_the_original() -> None:
    original = new_operation()
    changed = original.running().start_step("fetch", at(1))
    assert original == new_operation()
    assert changed is not original
    with pytest.raises(dataclasses.FrozenInstanceError):
        original.status = OperationStatus.RUNNING  # type: ignore[misc]


def test_succeed_sets_status_and_duration() -> None:
    op = new_operation().running().start_step("fetch", at(1)).finish_step(at(2), ok=True)
    done = op.succeed(at(7.5))
    assert done.status is OperationStatus.SUCCEEDED
    assert done.status.finished
    assert done.finished_at == at(7.5)
    assert done.duration_seconds == 7.5
    assert done.error is None


def test_fail_records_the_error() -> None:
    done = new_operation().running().fail(at(2), "checksum_mismatch", "1/model.py differs")
    assert done.status is OperationStatus.FAILED
    assert done.status.finished
    assert done.error == OperationError("checksum_mismatch", "1/model.py differs")
    assert done.duration_seconds == 2.0


def test_interrupt_fails_running_steps_and_keeps_finished_ones() -> None:
    op = new_operation().running()
    op = op.start_step("fetch", at(1)).finish_step(at(2), ok=True)
    op = op.start_step("load", at(3))

    done = op.interrupt(at(10))

    assert done.status is OperationStatus.INTERRUPTED
    assert done.status.finished
    assert done.finished_at == at(10)
    assert done.steps[0] == op.steps[0]
    assert done.steps[1] == Step("load", StepStatus.FAILED, at(3), at(10))
    assert done.error is not None
    assert done.error.code == "interrupted"
    assert "daemon stopped" in done.error.message


def test_interrupt_without_steps() -> None:
    done = new_operation().interrupt(at(1))
    assert done.steps == ()
    assert done.status is OperationStatus.INTERRUPTED


def test_finishing_without_any_step_raises() -> None:
    with pytest.raises(ValueError, match="op-1 has no running step"):
        new_operation().finish_step(at(1), ok=True)


def test_finishing_twice_raises() -> None:
    op = new_operation().start_step("fetch", at(0)).finish_step(at(1), ok=True)
    with pytest.raises(ValueError, match="no running step"):
        op.finish_step(at(2), ok=False)


@pytest.mark.parametrize(
    ("status", "finished"),
    [
        (OperationStatus.PENDING, False),
        (OperationStatus.RUNNING, False),
        (OperationStatus.SUCCEEDED, True),
        (OperationStatus.FAILED, True),
        (OperationStatus.INTERRUPTED, True),
    ],
)
def test_finished_statuses(status: OperationStatus, finished: bool) -> None:
    assert status.finished is finished
