"""In-memory fakes for the two ports unit tests cannot use for real: Triton and the clock.

Everything else a use case touches (the local store, staging, the config editor, SQLite) is
fast enough to use for real on ``tmp_path``, so :func:`make_deploy_service` wires the real
adapters exactly as ``controlplane/wiring.py`` does and swaps in only :class:`FakeTriton` and
:class:`FakeClock`. Fakes implement the Protocols in ``controlplane.ports`` and are injected
through constructors; nothing is patched.

:class:`FakeTriton` behaves like Triton in EXPLICIT mode where the use cases can tell: a failed
reload keeps the loaded version READY, a failed first load leaves the model UNAVAILABLE, and
``unload`` makes it UNAVAILABLE. Each ``load`` can be scripted per model (succeed, fail, raise,
or block until the test releases it, to cut a load short).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from controlplane.adapters.persistence.sqlite import SqliteStateRepo
from controlplane.adapters.staging.fs import StagingArea
from controlplane.adapters.stores.local import LocalStore
from controlplane.adapters.triton.model_config import ProtobufConfigEditor
from controlplane.domain.errors import (
    ControlPlaneError,
    PreflightFailed,
    TritonError,
    TritonLoadFailed,
    TritonTimeout,
    TritonUnavailable,
)
from controlplane.domain.smoke import SmokeSample
from controlplane.domain.traffic import TrafficPolicy
from controlplane.ports import Clock, IndexEntry, MetricsSource, Triton
from controlplane.services.coordination import ModelLocks, TaskOwner
from controlplane.services.deploy import DeployPolicy, DeployService
from controlplane.services.reconcile import Reconciler

__all__ = [
    "START",
    "FakeClock",
    "FakeTriton",
    "LoadBlocks",
    "LoadFails",
    "LoadOutcome",
    "LoadRaises",
    "LoadSucceeds",
    "Parts",
    "deploy_service",
    "make_deploy_service",
    "make_reconciler",
]

START = datetime(2025, 3, 1, 8, 0, 0, tzinfo=UTC)

# --- the clock ----------------------------------------------------------------------------


class FakeClock:
    """Time that moves only when a test says so: fixed start, :meth:`advance`."""

    def __init__(self, start: datetime = START) -> None:
        if start.tzinfo is None:
            raise ValueError("FakeClock needs a timezone-aware start")
        self._start = start.astimezone(UTC)
        self._elapsed = 0.0

    def now(self) -> datetime:
        return self._start + timedelta(seconds=self._elapsed)

    def monotonic(self) -> float:
        return self._elapsed

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self._elapsed += seconds


# --- Triton -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadSucceeds:
    """The model becomes READY."""


@dataclass(frozen=True)
class LoadFails:
    """Triton refuses the load (``TritonLoadFailed``); a loaded version stays READY."""

    reason: str = "initialize failed on purpose"


@dataclass(frozen=True)
class LoadRaises:
    """The call raises ``error`` (``TritonUnavailable``, or anything unexpected); no change."""

    error: Exception


@dataclass(frozen=True)
class LoadBlocks:
    """Set ``entered``, wait for ``release``, then behave as ``then``.

    Cancelled while waiting, it changes nothing, as a load cut short from our side would
    (the test decides what the real server would have done, if that matters).
    """

    entered: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    then: LoadSucceeds | LoadFails | LoadRaises = field(default_factory=LoadSucceeds)


LoadOutcome = LoadSucceeds | LoadFails | LoadRaises | LoadBlocks


class FakeTriton:
    """Triton's model control in memory: ``{model: IndexEntry}`` plus every call made."""

    def __init__(self) -> None:
        self.models: dict[str, IndexEntry] = {}
        self.calls: list[tuple[str, str]] = []
        self.live = True
        self.closed = False
        self._loads: dict[str, deque[LoadOutcome]] = {}
        self._index_failures = 0
        self._index_error: ControlPlaneError = TritonUnavailable("fake Triton is not reachable")
        self._stuck: set[str] = set()
        self.configs: dict[str, dict[str, Any]] = {}  # what loads with a config override set
        self.smoke_failures: dict[str, str] = {}  # model -> why its smoke inference fails

    # --- scripting ------------------------------------------------------------------------

    def script_load(self, model: str, *outcomes: LoadOutcome) -> None:
        """Queue what the next loads of ``model`` do; once used up, loads succeed."""
        self._loads.setdefault(model, deque()).extend(outcomes)

    def fail_index(self, times: int, error: ControlPlaneError | None = None) -> None:
        """Make the next ``times`` calls to :meth:`index` raise ``error`` (unreachable)."""
        self._index_failures = times
        if error is not None:
            self._index_error = error

    def stick(self, model: str) -> None:
        """``unload`` of ``model`` never completes: :meth:`wait_unavailable` times out."""
        self._stuck.add(model)

    def set_state(self, model: str, state: str, reason: str = "") -> None:
        self.models[model] = IndexEntry(name=model, version="1", state=state, reason=reason)

    def state(self, model: str) -> str | None:
        entry = self.models.get(model)
        return None if entry is None else entry.state

    def called(self, method: str, model: str) -> int:
        """How many times ``method`` was called for ``model``."""
        return self.calls.count((method, model))

    # --- the Triton protocol --------------------------------------------------------------

    async def is_live(self) -> bool:
        self.calls.append(("is_live", ""))
        return self.live

    async def load(self, model: str, *, config_json: str | None = None) -> None:
        self.calls.append(("load", model))
        if config_json is not None:
            self.configs[model] = json.loads(config_json)
        queued = self._loads.get(model)
        outcome: LoadOutcome = queued.popleft() if queued else LoadSucceeds()
        if isinstance(outcome, LoadBlocks):
            outcome.entered.set()
            await outcome.release.wait()
            outcome = outcome.then
        if isinstance(outcome, LoadRaises):
            raise outcome.error
        if isinstance(outcome, LoadFails):
            if self.state(model) != "READY":
                self.set_state(model, "UNAVAILABLE", outcome.reason)
            raise TritonLoadFailed(f"load of model {model!r} failed: {outcome.reason}")
        self.set_state(model, "READY")

    async def unload(self, model: str) -> None:
        self.calls.append(("unload", model))
        if model in self.models and model not in self._stuck:
            self.set_state(model, "UNAVAILABLE", "unloaded")

    async def index(self) -> list[IndexEntry]:
        self.calls.append(("index", ""))
        if self._index_failures > 0:
            self._index_failures -= 1
            raise self._index_error
        return list(self.models.values())

    async def wait_unavailable(self, model: str, timeout: float) -> None:
        self.calls.append(("wait_unavailable", model))
        if self.state(model) in (None, "UNAVAILABLE"):
            return
        raise TritonTimeout(f"model {model!r} is still {self.state(model)} after {timeout} s")

    async def model_config(self, model: str) -> dict[str, Any]:
        self.calls.append(("model_config", model))
        if self.state(model) != "READY":
            raise TritonError(f"model {model!r} is not loaded")
        if model in self.configs:
            return self.configs[model]
        tensor = {"data_type": "TYPE_FP32", "dims": ["-1"]}
        return {
            "name": model,
            "backend": "python",
            "max_batch_size": 0,
            "input": [{"name": "INPUT0", **tensor}],
            "output": [{"name": "OUTPUT0", **tensor}],
        }

    async def smoke(self, model: str, sample: SmokeSample | None) -> dict[str, list[float]]:
        self.calls.append(("smoke", model))
        if model in self.smoke_failures:
            raise PreflightFailed(f"smoke inference on {model!r}: {self.smoke_failures[model]}")
        return {"OUTPUT0": [1.0]}

    async def close(self) -> None:
        self.closed = True


# --- wiring -------------------------------------------------------------------------------


@dataclass
class Parts:
    """What :func:`make_deploy_service` built, for tests to arrange and inspect."""

    store_path: Path
    repository: Path
    staging_path: Path
    store: LocalStore
    staging: StagingArea
    repo: SqliteStateRepo
    triton: FakeTriton
    clock: FakeClock
    locks: ModelLocks
    tasks: TaskOwner
    load_slots: asyncio.Semaphore

    async def close(self) -> None:
        """Shut down as the daemon does: cancel and await operations, close the database."""
        try:
            await self.tasks.close()
        finally:
            self.repo.close()


def make_deploy_service(
    tmp_path: Path,
    triton: FakeTriton,
    clock: FakeClock,
    *,
    cache_max_bytes: int = 0,
    traffic: TrafficPolicy | None = None,
    metrics: MetricsSource | None = None,
) -> tuple[DeployService, Parts]:
    """Wire a DeployService like ``wiring.build``: real adapters under ``tmp_path``.

    Layout: ``store/``, ``repository/``, ``staging/`` and ``state/controlplane.db``. Calling it
    again on the same ``tmp_path`` (after closing the first) is a daemon restart. Must run
    inside the event loop that will run the operations.
    """
    asyncio.get_running_loop()  # fail here, not deep inside a deploy
    store_path = tmp_path / "store"
    store_path.mkdir(exist_ok=True)
    repository = tmp_path / "repository"
    staging_path = tmp_path / "staging"
    staging = StagingArea(repository, staging_path, cache_max_bytes=cache_max_bytes)
    staging.check()
    repo = SqliteStateRepo(tmp_path / "state" / "controlplane.db")
    store = LocalStore(store_path)
    locks = ModelLocks()
    tasks = TaskOwner()
    load_slots = asyncio.Semaphore(2)
    triton_port: Triton = triton
    clock_port: Clock = clock
    service = DeployService(
        store=store,
        staging=staging,
        editor=ProtobufConfigEditor(),
        triton=triton_port,
        repo=repo,
        clock=clock_port,
        locks=locks,
        tasks=tasks,
        load_slots=load_slots,
        policy=DeployPolicy(),
        traffic=None if traffic is None else (lambda _model: traffic),
        metrics=metrics,
    )
    parts = Parts(
        store_path=store_path,
        repository=repository,
        staging_path=staging_path,
        store=store,
        staging=staging,
        repo=repo,
        triton=triton,
        clock=clock,
        locks=locks,
        tasks=tasks,
        load_slots=load_slots,
    )
    return service, parts


def make_reconciler(service: DeployService, parts: Parts) -> Reconciler:
    """The start-up reconciler over the same adapters, as ``wiring.build`` makes it."""
    return Reconciler(
        deploy=service,
        staging=parts.staging,
        triton=parts.triton,
        repo=parts.repo,
        clock=parts.clock,
        unload_timeout=DeployPolicy().unload_timeout,
    )


@asynccontextmanager
async def deploy_service(
    tmp_path: Path,
    triton: FakeTriton | None = None,
    clock: FakeClock | None = None,
    *,
    cache_max_bytes: int = 0,
    traffic: TrafficPolicy | None = None,
    metrics: MetricsSource | None = None,
) -> AsyncIterator[tuple[DeployService, Parts]]:
    """:func:`make_deploy_service`, closed on exit (tasks cancelled and awaited, db closed)."""
    service, parts = make_deploy_service(
        tmp_path,
        triton or FakeTriton(),
        clock or FakeClock(),
        cache_max_bytes=cache_max_bytes,
        traffic=traffic,
        metrics=metrics,
    )
    try:
        yield service, parts
    finally:
        await parts.close()


class FakeMetrics:
    """Pending requests per model, set by the test; None means the scrape failed."""

    def __init__(self) -> None:
        self.pending: dict[str, int | None] = {}
        self.reads: list[str] = []

    async def pending_requests(self, model: str) -> int | None:
        self.reads.append(model)
        return self.pending.get(model, 0)

    async def close(self) -> None:
        return None
