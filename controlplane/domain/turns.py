"""Turns out of rotation: how a rolling update keeps most of the fleet serving.

A member updating a model that fits once in GPU memory leaves rotation while it unloads the
old release and loads the new one. At most ``max_unavailable`` members may be out for one model
at once, across the fleet, so each takes a *turn* first: an entry in the model's desired state,
written compare-and-swap like every other change of it. A turn is given back when the member
is in rotation again; a turn whose holder is no longer alive, or restarted since (another
incarnation beats under its name), holds nothing and is dropped by the next member to look.

Pure: standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controlplane.domain.stored import maybe_text, moment, text


@dataclass(frozen=True)
class RollingPolicy:
    """How one model rolls (``rollout.*``, ``drain_timeout_seconds``, ``memory.*``)."""

    max_unavailable: int = 1
    unready_seconds: float = 5.0
    drain_timeout: float = 60.0
    return_seconds: float = 60.0
    allow_downtime: bool = False
    turn_timeout: float = 3600.0  # waiting behind the other members' turns


@dataclass(frozen=True)
class Turn:
    member: str
    incarnation: str  # the holder's process: one that restarted let go of its turn
    at: datetime  # when it was taken
    release: str | None  # what the holder updates to

    def held(self, alive: Mapping[str, str]) -> bool:
        """Whether the turn still holds, given the incarnation of every live member by name:
        its member is alive, as the process that took it."""
        return alive.get(self.member) == self.incarnation


def turn_for_storage(turn: Turn) -> dict[str, Any]:
    return {
        "member": turn.member,
        "incarnation": turn.incarnation,
        "at": turn.at.isoformat(),
        "release": turn.release,
    }


def turn_from_storage(data: Mapping[str, Any], what: str) -> Turn:
    return Turn(
        member=text(data["member"], f"{what}.member"),
        incarnation=text(data["incarnation"], f"{what}.incarnation"),
        at=moment(data["at"], f"{what}.at"),
        release=maybe_text(data.get("release"), f"{what}.release"),
    )
