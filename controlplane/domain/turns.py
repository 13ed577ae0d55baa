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

from controlplane.domain.names import validate_member_name, validate_release_name
from controlplane.domain.operations import Operation, OperationStatus
from controlplane.domain.stored import maybe_named, moment, named, text

# The steps of a rolling update that a member shows the fleet, in their order.
ROLLING_PHASES = (
    "turn",
    "drain",
    "unload",
    "memory",
    "load",
    "preflight",
    "switch",
    "restore",
    "rejoin",
)


@dataclass(frozen=True)
class RollingPolicy:
    """How one model rolls (``rollout.*``, ``drain_timeout_seconds``, ``memory.*``)."""

    max_unavailable: int = 1
    unready_seconds: float = 5.0
    drain_timeout: float = 60.0
    return_seconds: float = 60.0
    allow_downtime: bool = False
    turn_timeout: float = 3600.0  # waiting behind the other members' turns
    restart_triton: bool = False  # memory.on_not_returned: restart-triton
    restart_seconds: float = 300.0  # for Triton to stop and be live again

    @property
    def waits(self) -> float:
        """The longest a rolling update waits beyond its fetch and load: out of rotation
        before the drain and after the switch (``unready_seconds`` each), the drain, the
        memory's return, and a restart of Triton when that is how memory comes back. A budget
        for a rolling update is a load's plus this."""
        restart = self.restart_seconds + self.return_seconds if self.restart_triton else 0.0
        return 2 * self.unready_seconds + self.drain_timeout + self.return_seconds + restart


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
        member=named(data["member"], f"{what}.member", validate_member_name),
        incarnation=text(data["incarnation"], f"{what}.incarnation"),
        at=moment(data["at"], f"{what}.at"),
        release=maybe_named(data.get("release"), f"{what}.release", validate_release_name),
    )


# What a member is doing in a rolling update, by the step that runs.
_PHASE_WORDS = {
    "turn": "waiting for its turn",
    "drain": "draining",
    "unload": "unloading",
    "memory": "waiting for GPU memory",
    "load": "loading",
    "preflight": "preflight",
    "switch": "switching",
    "restore": "restoring the previous release",
    "rejoin": "back in rotation, letting the load balancer see it",
}


@dataclass(frozen=True)
class Progress:
    """Where one member is in a rolling update of a model (its heartbeat shows it)."""

    phase: str | None = None  # the step running now (None: none runs)
    took: tuple[tuple[str, float], ...] = ()  # each phase done so far: (step, seconds)
    failed: str | None = None  # the error code of the update, when it ended failed

    @property
    def summary(self) -> str:
        """In a few words: the phase it is in (or done), and how long each phase took, as in
        ``draining; turn 0.0 s, drain 5.1 s``; empty when it did not roll."""
        if self.phase is None and not self.took:
            return ""
        ended = f"failed ({self.failed})" if self.failed else "done"
        now = _PHASE_WORDS.get(self.phase, self.phase) if self.phase else ended
        took = ", ".join(f"{step} {seconds:.1f} s" for step, seconds in self.took)
        return f"{now}; {took}" if took else now


def rolling_progress(operation: Operation | None) -> Progress:
    """The rolling phases of ``operation`` (the member's latest on the model): empty for an
    operation that did not roll (it took no turn and drained nothing)."""
    if operation is None or not any(s.name in ("turn", "drain") for s in operation.steps):
        return Progress()
    running = operation.status is OperationStatus.RUNNING
    last = operation.steps[-1] if operation.steps else None
    phase = last.name if running and last is not None and last.finished_at is None else None
    took = tuple(
        (step.name, round(step.duration_seconds, 3))
        for step in operation.steps
        if step.name in ROLLING_PHASES and step.duration_seconds is not None
    )
    error = operation.error if operation.status is OperationStatus.FAILED else None
    return Progress(phase, took, failed=error.code if error is not None else None)
