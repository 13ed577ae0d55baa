"""What a strategy is: the interface ``blue-green`` and ``inplace`` implement.

The deploy service and the reconcile loop know a model's strategy only through this Protocol:
they read the model once (a :class:`~controlplane.services.slots.SlotSnapshot` with the slots
the strategy names), hand it over, and record what comes back. A new strategy is one module
that implements it and one entry in the table ``wiring`` builds; nothing else changes.

The operations a strategy runs (deploy, roll back to a warm release, unload, repair) receive
the operation's :class:`~controlplane.services.runner.Run` and move slots only through the
slot book, so every change is recorded with its trigger. What it answers without an operation
(which slots it has, which serves, what Triton must show) is read from the snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from controlplane.domain.drift import Assessment, Observed
from controlplane.domain.slots import Slot
from controlplane.domain.traffic import Strategy
from controlplane.ports import IndexEntry, ReleaseMarker
from controlplane.services.runner import Run
from controlplane.services.slots import SlotSnapshot


class ModelStrategy(Protocol):
    @property
    def kind(self) -> Strategy: ...

    def slot_names(self, model: str) -> tuple[str, ...]:
        """The slots the model always has under this strategy (its snapshot lists them)."""
        ...

    def serving_name(self, snapshot: SlotSnapshot) -> str | None:
        """The Triton model whose load is what serves (the active slot); None when none is."""
        ...

    def warm(self, snapshot: SlotSnapshot, release: str) -> Slot | None:
        """A slot that still holds ``release`` loaded: going back to it needs no load."""
        ...

    async def deploy(
        self, run: Run, snapshot: SlotSnapshot, *, revision: str | None, force: bool
    ) -> None:
        """Serve ``run.operation.release``, from the store; the serving release serves on if
        anything fails before the switch."""
        ...

    async def roll_back(self, run: Run, snapshot: SlotSnapshot, warm: Slot) -> None:
        """Serve ``warm``'s release again without a load (:meth:`warm` found it)."""
        ...

    async def unload(self, run: Run, snapshot: SlotSnapshot) -> None:
        """Serve nothing: every slot unloaded and removed, each audited for residue."""
        ...

    async def observe(
        self,
        snapshot: SlotSnapshot,
        index: Mapping[str, IndexEntry],
        placed: Mapping[str, ReleaseMarker],
    ) -> Observed:
        """The model as Triton and the repository show it, for :func:`~controlplane.domain.
        drift.assess` (and anything kept alongside, such as retire windows, put right)."""
        ...

    async def settle(self, seen: Observed) -> None:
        """Record each slot as Triton and the repository show it (before a redeploy)."""
        ...

    async def repair(self, run: Run, seen: Observed, assessment: Assessment) -> None:
        """Put back what :func:`~controlplane.domain.drift.assess` found missing, without the
        store (load from disk, re-point, remove, take down)."""
        ...

    def not_serving(self, snapshot: SlotSnapshot, index: Mapping[str, IndexEntry]) -> str | None:
        """Why clients do not get what should serve, from Triton's index alone; None if they do."""
        ...
