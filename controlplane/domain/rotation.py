"""Why a member is out of rotation for a model: one of a few kinds, each with its own end.

A rolling update *drains* the member for the model while it unloads and loads it (it returns
when the update ends); one whose old release's GPU memory did not come back is *held* out
(``memory_not_returned``) until a later deploy of the model succeeds. ``/readyz`` and status
say the reason in words; the kind is what metrics and alerts select on, so it is a value of
its own, never parsed back out of those words.

Pure: standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class OutReason(StrEnum):
    """Why a model keeps this member out of rotation (the ``reason`` label of
    ``controlplane_model_out_of_rotation``)."""

    DRAINING = "draining"  # a rolling update drains, unloads and loads it: back when it ends
    MEMORY_NOT_RETURNED = "memory_not_returned"  # held: until a deploy of it succeeds


@dataclass(frozen=True)
class OutOfRotation:
    """Why one model keeps this member out of rotation: its kind, and the words ``/readyz``
    and status say (``draining <model>``, ``memory_not_returned: ...``)."""

    kind: OutReason
    reason: str

    @property
    def held(self) -> bool:
        """Kept out after its operation ended (the memory did not come back)."""
        return self.kind is OutReason.MEMORY_NOT_RETURNED
