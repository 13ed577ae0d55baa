"""A member out of rotation, and why: the rotation's own state by kind.

A rolling update drains a model inside ``Rotation.out``; memory that does not come back ends
the block with :class:`MemoryNotReturned`, which holds the member out. The tests drive that
block directly (the rolling update's own path is in tests/integration/test_rolling_single.py).
"""

from __future__ import annotations

import pytest

from controlplane.domain.errors import MemoryNotReturned
from controlplane.domain.rotation import OutReason
from controlplane.services.rotation import Rotation

WHY = "the GPU memory r1 held did not come back within 60 s of its unload"


def _hold(rotation: Rotation, model: str) -> None:
    """A rolling update of ``model`` that stops with ``memory_not_returned``."""
    with pytest.raises(MemoryNotReturned), rotation.out(model):
        raise MemoryNotReturned(WHY)


# --- the rotation ----------------------------------------------------------------------------


def test_a_rolling_update_is_out_as_draining_and_back_in_when_it_ends() -> None:
    rotation = Rotation()

    with rotation.out("m"):
        during = (rotation.kinds(), rotation.reason_of("m"), rotation.held("m"))

    assert during == ({"m": OutReason.DRAINING}, "draining m", None)
    assert (rotation.kinds(), rotation.reason_of("m"), rotation.why_out()) == ({}, None, None)


def test_memory_not_returned_holds_the_member_out_until_a_later_deploy_succeeds() -> None:
    rotation = Rotation()

    _hold(rotation, "m")
    with rotation.out("other"):
        both = rotation.kinds()
    rotation.release("other")  # a deploy of another model does not end the hold on m
    held = (rotation.kinds(), rotation.reason_of("m"), rotation.held("m"))
    rotation.release("m")

    assert both == {"m": OutReason.MEMORY_NOT_RETURNED, "other": OutReason.DRAINING}
    assert held == (
        {"m": OutReason.MEMORY_NOT_RETURNED},
        f"memory_not_returned: {WHY}",
        f"memory_not_returned: {WHY}",
    )
    assert (rotation.kinds(), rotation.reason_of("m"), rotation.why_out()) == ({}, None, None)


def test_any_other_failure_brings_the_member_back_at_once() -> None:
    rotation = Rotation()

    with pytest.raises(RuntimeError), rotation.out("m"):
        raise RuntimeError("the load failed; the old release was restored")

    assert rotation.kinds() == {}
