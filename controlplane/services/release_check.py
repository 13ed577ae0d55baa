"""``controlplane release check``: the checks a deploy makes before it needs Triton, run on a
publisher's release dir, offline, through the deploy's own code.

Nothing here is a second copy of a check. The release is prepared as a deploy prepares it
(:func:`~controlplane.services.prepare.prepare_release`: the names, ``SHA256SUMS`` and the
files it lists, no symlinks, special files, absolute paths or ``..``, ``config.pbtxt``
against Triton's schema and its memory hint, a version dir, Python that compiles), from a
store that holds just that dir (``adapters/stores/release_dir.py``), into a staging area of
its own that is thrown away after. Then the ``check`` step's own reading of ``smoke.json``.
So a refusal carries the code and the message a deploy of the same release would give. Given
a keyring (and whether a signature is required), the ``signature`` step runs first, as on a
member with that ``store.keyring``.

What needs Triton is left to the deploy: the load, the smoke inference and its answer, the
headroom, whether a blue-green alias can front the model (it depends on the strategy of the
daemon that deploys it).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from controlplane.domain.names import validate_model_name, validate_release_name
from controlplane.domain.operations import (
    Operation,
    OperationKind,
    OperationStatus,
    Step,
    Trigger,
)
from controlplane.domain.smoke import SMOKE_NAME, parse_smoke
from controlplane.ports import ModelConfigEditor, ModelStore, Staging
from controlplane.services.prepare import SignaturePolicy, prepare_release
from controlplane.services.tracker import OperationTracker
from controlplane.timing import SystemClock

# The name the checked config is given in staging (a deploy gives the slot's): nothing loads it.
CHECKED_AS = "release-check"


@dataclass(frozen=True)
class CheckedRelease:
    """A release that passed: what a deploy would find in it."""

    model: str
    release: str
    files: int
    bytes: int
    backend: str
    smoke: str  # "smoke.json", or "generated" (the preflight makes its inputs from the config)
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class ReleaseCheck:
    """The parts a check runs on: the release as a store, a throwaway staging area, and
    Triton's config schema."""

    store: ModelStore
    staging: Staging
    editor: ModelConfigEditor
    signatures: SignaturePolicy | None = None  # a keyring: SHA256SUMS.sig checked first

    async def run(self, model: str, release: str) -> CheckedRelease:
        """Check ``release`` of ``model``; a refusal is the deploy's own error."""
        validate_model_name(model)
        validate_release_name(release)
        clock = SystemClock()
        operation = Operation(
            id=f"check-{uuid.uuid4().hex[:12]}",
            kind=OperationKind.DEPLOY,
            model=model,
            release=release,
            trigger=Trigger.CLI,
            status=OperationStatus.RUNNING,
            created_at=clock.now(),
        )
        journal = _Kept()
        tracker = OperationTracker(operation, journal, clock)
        try:
            prepared = await prepare_release(
                tracker,
                store=self.store,
                staging=self.staging,
                editor=self.editor,
                require_checksums=True,
                model=model,
                release=release,
                target=CHECKED_AS,
                signatures=self.signatures,
            )
            async with tracker.step("check"):
                smoke = prepared.path / SMOKE_NAME
                shipped = await asyncio.to_thread(smoke.is_file)
                if shipped:  # read as the deploy's check step reads it
                    parse_smoke(await asyncio.to_thread(smoke.read_text, encoding="utf-8"))
                tracker.detail(smoke=SMOKE_NAME if shipped else "generated")
        finally:
            await asyncio.to_thread(self.staging.cleanup, operation.id)
        done = tracker.operation
        fetch = next(step for step in done.steps if step.name == "fetch")
        return CheckedRelease(
            model=model,
            release=release,
            files=int(str(fetch.detail.get("files", 0))),
            bytes=prepared.size_bytes,
            backend=prepared.summary.backend,
            smoke=str(done.steps[-1].detail.get("smoke", "generated")),
            steps=done.steps,
        )


class _Kept:
    """The operation's record, kept in memory: a check is no operation of any daemon."""

    def __init__(self) -> None:
        self.last: Operation | None = None
        self._writes = 0

    @property
    def writes(self) -> int:
        return self._writes

    def save(self, operation: Operation) -> None:
        self.last = operation
        self._writes += 1

    async def get(self, operation_id: str) -> Operation | None:
        return self.last if self.last is not None and self.last.id == operation_id else None

    async def recent(
        self,
        model: str | None = None,
        limit: int = 20,
        kinds: Collection[OperationKind] | None = None,
    ) -> list[Operation]:
        return [] if self.last is None else [self.last]

    async def unfinished(self) -> list[Operation]:
        return []

    async def latest(
        self, models: Sequence[str], kinds: Collection[OperationKind] | None = None
    ) -> dict[str, Operation]:
        return {}

    async def last_deploys(self, releases: Mapping[str, str]) -> dict[str, Operation]:
        return {}

    async def flush(self) -> None:
        return None
