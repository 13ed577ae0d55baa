"""In-memory fakes for the ports unit tests cannot use for real, or not on cue: Triton, the
clock, and the fleet's records (another member's write landing in the middle of a swap).

Everything else a use case touches (the local store, staging, the config editor, SQLite) is
fast enough to use for real on ``tmp_path``, so :func:`make_deploy_service` wires the real
adapters exactly as ``controlplane.wiring`` does and swaps in only :class:`FakeTriton` and
:class:`FakeClock`. Fakes implement the Protocols in ``controlplane.ports`` and are injected
through constructors; nothing is patched.

:class:`FakeTriton` behaves like Triton in EXPLICIT mode where the use cases can tell: a failed
reload keeps the loaded version READY, a failed first load leaves the model UNAVAILABLE,
``unload`` makes it UNAVAILABLE, and a load that never ends keeps the model LOADING (its
unload is never served). Each load can be scripted per model (succeed, fail, raise, block until
the test releases it, or hang), whether from files, an alias re-point or a CPU-only reload.

:class:`FakeDesiredStates` keeps the fleet's records in memory with the stores' compare-and-swap
(and their conflict, built by the same function); a test queues other members' writes to land
inside the next swaps, before they compare.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.adapters.persistence import SqliteRepos
from controlplane.adapters.staging.fs import StagingArea
from controlplane.adapters.stores.fleet_records import conflict
from controlplane.adapters.stores.local import LocalStore
from controlplane.adapters.triton.model_config import ProtobufConfigEditor
from controlplane.adapters.triton.overrides import alias_config, cpu_only_config, signature_of
from controlplane.domain.errors import (
    ControlPlaneError,
    PreflightFailed,
    StoreUnavailable,
    TritonError,
    TritonLoadFailed,
    TritonTimeout,
    TritonUnavailable,
)
from controlplane.domain.fleet import DesiredModel, MemberBeat
from controlplane.domain.operations import Operation, Trigger, Unchanged
from controlplane.domain.refusals import Refusal
from controlplane.domain.smoke import SmokeSample
from controlplane.domain.traffic import Signature, Strategy, TrafficPolicy
from controlplane.domain.triton import TritonState
from controlplane.ports import Clock, IndexEntry, MetricsSource, ModelStore, Triton
from controlplane.services.assembly import Limits, assemble
from controlplane.services.bluegreen import BlueGreen
from controlplane.services.deploy import DeployService
from controlplane.services.memory import HeadroomPolicy, LeakPolicy, MemoryWatch
from controlplane.services.operations import OperationClient
from controlplane.services.reconcile import Reconciler
from controlplane.services.rotation import Rotation
from controlplane.services.runner import OperationRunner
from controlplane.services.slots import LoadSlots, SlotBook
from controlplane.services.status import StatusService
from controlplane.services.tasks import TaskOwner
from controlplane.services.watcher import ReleaseWatcher
from tests.support.fake_clock import START, FakeClock

__all__ = [
    "START",
    "FakeClock",
    "FakeDesiredStates",
    "FakeTriton",
    "LoadBlocks",
    "LoadFails",
    "LoadHangs",
    "LoadOutcome",
    "LoadRaises",
    "LoadSucceeds",
    "Parts",
    "deploy_service",
    "make_deploy_service",
    "make_reconciler",
    "started",
    "started_rollback",
]

# --- the clock: tests/support/fake_clock.py ---------------------------------------------------

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


@dataclass(frozen=True)
class LoadHangs:
    """The load never ends (a Python ``initialize()`` that sleeps forever): the model stays
    LOADING, the call raises ``TritonTimeout`` as the driver's deadline would, and an unload
    of it is never served."""


LoadOutcome = LoadSucceeds | LoadFails | LoadRaises | LoadBlocks | LoadHangs


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
        self._connection_waiters: list[asyncio.Future[None]] = []

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
        entry = IndexEntry(name=model, version="1", state=TritonState.parse(state), reason=reason)
        self.models[model] = entry

    def state(self, model: str) -> str | None:
        entry = self.models.get(model)
        return None if entry is None else entry.state

    def called(self, method: str, model: str) -> int:
        """How many times ``method`` was called for ``model``."""
        return self.calls.count((method, model))

    # --- the Triton protocol --------------------------------------------------------------

    async def is_live(self) -> bool:
        return await self.liveness() is None

    async def liveness(self) -> str | None:
        self.calls.append(("is_live", ""))  # one liveness check, whichever method asked
        return None if self.live else "Triton at fake:8001 cannot be reached (the fake is down)"

    @property
    def watched(self) -> bool:
        """Someone waits in :meth:`connection_lost`."""
        return bool(self._connection_waiters)

    async def connection_lost(self) -> None:
        """Returns when :meth:`restart` is called (a future of the running loop: a fake may
        serve several ``asyncio.run``)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._connection_waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in self._connection_waiters:
                self._connection_waiters.remove(waiter)

    async def load(self, model: str) -> None:
        self.calls.append(("load", model))
        await self._load(model)

    async def point_alias(self, alias: str, slot: str, signature: Signature) -> None:
        self.calls.append(("point_alias", alias))
        await self._load(alias)
        self.configs[alias] = alias_config(alias, slot, signature)

    async def reload_cpu_only(self, model: str) -> list[dict[str, object]]:
        self.calls.append(("reload_cpu_only", model))
        config = cpu_only_config(self._config(model))
        await self._load(model)
        self.configs[model] = config
        groups: list[dict[str, object]] = config["instance_group"]
        return groups

    async def _load(self, model: str) -> None:
        queued = self._loads.get(model)
        outcome: LoadOutcome = queued.popleft() if queued else LoadSucceeds()
        if isinstance(outcome, LoadBlocks):
            outcome.entered.set()
            await outcome.release.wait()
            outcome = outcome.then
        if isinstance(outcome, LoadHangs):
            self.set_state(model, "LOADING")
            self._stuck.add(model)
            raise TritonTimeout(f"load of {model!r} did not end within the load timeout")
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

    async def abandon(self, model: str, wait: float) -> bool:
        self.calls.append(("abandon", model))
        await self.unload(model)
        return self.state(model) != "LOADING"

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

    async def signature(self, model: str) -> Signature:
        self.calls.append(("signature", model))
        return signature_of(self._config(model))

    async def alias_target(self, alias: str) -> str | None:
        self.calls.append(("alias_target", alias))
        if self.state(alias) != "READY" or alias not in self.configs:
            return None
        steps = self.configs[alias].get("ensemble_scheduling", {}).get("step", [])
        return str(steps[0]["model_name"]) if len(steps) == 1 else None

    def restart(self) -> None:
        """Triton restarted: nothing is loaded, nothing is stuck, overrides are gone, and the
        daemon's connection to it broke."""
        self.models.clear()
        self.configs.clear()
        self._stuck.clear()
        for waiter in self._connection_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._connection_waiters.clear()

    def _config(self, model: str) -> dict[str, Any]:
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
            "instance_group": [{"kind": "KIND_GPU", "count": 1}],
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
    repos: SqliteRepos
    triton: FakeTriton
    clock: FakeClock
    runner: OperationRunner
    tasks: TaskOwner
    load_slots: LoadSlots
    slots: SlotBook
    bluegreen: BlueGreen
    policy: TrafficPolicy
    reconciler: Reconciler
    client: OperationClient
    rotation: Rotation  # what keeps this member out of rotation (the reconcile loop's holds)

    async def close(self) -> None:
        """Shut down as the daemon does: cancel and await operations, close the database."""
        try:
            await self.runner.close()
            await self.tasks.close()
        finally:
            self.repos.close()


def make_deploy_service(
    tmp_path: Path,
    triton: FakeTriton,
    clock: FakeClock,
    *,
    cache_max_bytes: int = 0,
    traffic: TrafficPolicy | None = None,
    metrics: MetricsSource | None = None,
    load_slots: int = 2,
    max_release_bytes: int | None = None,
    store: Callable[[LocalStore], ModelStore] | None = None,
    min_release: str | None = None,
) -> tuple[DeployService, Parts]:
    """Wire a DeployService like ``wiring.build``: real adapters under ``tmp_path``.

    Layout: ``store/``, ``repository/``, ``staging/`` and ``state/controlplane.db``. Calling it
    again on the same ``tmp_path`` (after closing the first) is a daemon restart. Must run
    inside the event loop that will run the operations. The default policy is ``inplace``.
    ``store`` wraps the local store (a fake that delegates to it) for the service; ``Parts.store``
    stays the local store.
    """
    asyncio.get_running_loop()  # fail here, not deep inside a deploy
    store_path = tmp_path / "store"
    store_path.mkdir(exist_ok=True)
    repository = tmp_path / "repository"
    staging_path = tmp_path / "staging"
    staging = StagingArea(repository, staging_path, cache_max_bytes=cache_max_bytes)
    staging.check()
    repos = SqliteRepos.open(tmp_path / "state" / "controlplane.db")
    local = LocalStore(store_path)
    served: ModelStore = local if store is None else store(local)
    tasks = TaskOwner()
    triton_port: Triton = triton
    clock_port: Clock = clock
    policy = traffic or TrafficPolicy(strategy=Strategy.INPLACE)
    memory = MemoryWatch(
        processes=None, figures=None, book=repos.memory, clock=clock_port, policy=LeakPolicy()
    )
    pipelines = assemble(
        store=served,
        staging=staging,
        editor=ProtobufConfigEditor(),
        triton=triton_port,
        metrics=metrics or FakeMetrics(),
        serving=repos.serving,
        journal=repos.operations,
        releases=repos.releases,
        rollbacks=repos.rollbacks,
        memory=memory,
        headroom=HeadroomPolicy(),
        clock=clock_port,
        timers=tasks,
        policy_for=lambda _model: policy,
        limits=Limits(
            concurrent_loads=load_slots,
            unload_seconds=5.0,
            abandon_seconds=0.1,
            max_release_bytes=max_release_bytes,
        ),
        floor_for=lambda _model: min_release,
    )
    parts = Parts(
        store_path=store_path,
        repository=repository,
        staging_path=staging_path,
        store=local,
        staging=staging,
        repos=repos,
        triton=triton,
        clock=clock,
        runner=pipelines.runner,
        tasks=tasks,
        load_slots=pipelines.load_slots,
        slots=pipelines.slots,
        bluegreen=pipelines.bluegreen,
        policy=policy,
        reconciler=pipelines.reconciler,
        client=pipelines.client,
        rotation=pipelines.rotation,
    )
    return pipelines.deploy, parts


def make_reconciler(service: DeployService, parts: Parts) -> Reconciler:
    """The reconcile loop over the same adapters, wired with them (as ``wiring.build`` does)."""
    return parts.reconciler


def release_watcher(service: DeployService, parts: Parts, **given: Any) -> ReleaseWatcher:
    """The release watcher over ``parts`` (auto-deploy off, a 60 s beat); ``given`` replaces
    any of its arguments."""
    arguments: dict[str, Any] = {
        "store": parts.store,
        "deploy": service,
        "client": parts.client,
        "releases": parts.repos.releases,
        "serving": parts.repos.serving,
        "rollbacks": parts.repos.rollbacks,
        "clock": parts.clock,
        "tasks": parts.tasks,
        "auto_deploy": lambda _model: False,
        "interval": 60.0,
    }
    return ReleaseWatcher(**{**arguments, **given})


def status_service(service: DeployService, parts: Parts, **given: Any) -> StatusService:
    """The status service over ``parts``; ``given`` adds or replaces arguments (``catalog``)."""
    arguments: dict[str, Any] = {
        "serving": parts.repos.serving,
        "journal": parts.repos.operations,
        "rollbacks": parts.repos.rollbacks,
        "store": parts.store,
        "triton": parts.triton,
        "clock": parts.clock,
        "holder": parts.client.holder,
    }
    return StatusService(**{**arguments, **given})


@asynccontextmanager
async def deploy_service(
    tmp_path: Path,
    triton: FakeTriton | None = None,
    clock: FakeClock | None = None,
    *,
    cache_max_bytes: int = 0,
    traffic: TrafficPolicy | None = None,
    metrics: MetricsSource | None = None,
    load_slots: int = 2,
    max_release_bytes: int | None = None,
    store: Callable[[LocalStore], ModelStore] | None = None,
    min_release: str | None = None,
) -> AsyncIterator[tuple[DeployService, Parts]]:
    """:func:`make_deploy_service`, closed on exit (tasks cancelled and awaited, db closed)."""
    service, parts = make_deploy_service(
        tmp_path,
        triton or FakeTriton(),
        clock or FakeClock(),
        cache_max_bytes=cache_max_bytes,
        traffic=traffic,
        metrics=metrics,
        load_slots=load_slots,
        max_release_bytes=max_release_bytes,
        store=store,
        min_release=min_release,
    )
    try:
        yield service, parts
    finally:
        await parts.close()


async def started(
    service: DeployService,
    model: str,
    release: str,
    *,
    trigger: Trigger = Trigger.API,
    force: bool = False,
) -> Operation:
    """Start a deploy that must not be a no-op (the release does not serve yet)."""
    result = await service.deploy(model, release, trigger=trigger, force=force)
    assert not isinstance(result, Unchanged), result.message
    return result


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


async def started_rollback(
    service: DeployService, model: str, *, to: str | None, trigger: Trigger = Trigger.API
) -> Operation:
    """Start a rollback that must not be a no-op (its target does not serve yet)."""
    result = await service.rollback(model, to=to, trigger=trigger)
    assert not isinstance(result, Unchanged), result.message
    return result


# --- the fleet's records ------------------------------------------------------------------


class FakeDesiredStates:
    """:class:`~controlplane.ports.DesiredStates` in memory: ``desired`` and ``heartbeats`` by
    name, every record a swap wrote in ``written``. :meth:`meanwhile` queues another member's
    write to land inside the next swap, after its caller read the record and before it compares.
    """

    where = "memory://fleet/_controlplane"

    def __init__(self) -> None:
        self.desired: dict[str, DesiredModel] = {}
        self.heartbeats: dict[str, MemberBeat] = {}
        self.written: list[DesiredModel] = []
        self.refused: dict[str, Refusal] = {}  # what unreadable() says: records a read refused
        self.reads: list[frozenset[str]] = []  # each read_all, by the models it was told of
        self.failing = 0  # this many read_all calls from now on raise StoreUnavailable
        self._meanwhile: deque[Callable[[], DesiredModel]] = deque()
        self._lock = threading.Lock()

    def meanwhile(self, write: Callable[[], DesiredModel]) -> None:
        """Inside the next swap not yet given one, store ``write()``'s record as it stands."""
        self._meanwhile.append(write)

    def read(self, model: str, *, patient: bool = False) -> DesiredModel | None:
        return self.desired.get(model)

    def read_all(self, named: Collection[str] = ()) -> dict[str, DesiredModel]:
        self.reads.append(frozenset(named))
        if self.failing > 0:
            self.failing -= 1
            raise StoreUnavailable(f"{self.where} does not answer (the test says so)")
        return dict(self.desired)

    def swap(self, desired: DesiredModel) -> None:
        with self._lock:
            if self._meanwhile:
                other = self._meanwhile.popleft()()
                self.desired[other.model] = other
            current = self.desired.get(desired.model)
            if (current.generation if current else 0) != desired.generation - 1:
                raise conflict(desired, current, self.where)
            self.desired[desired.model] = desired
            self.written.append(desired)

    def beat(self, beat: MemberBeat) -> None:
        self.heartbeats[beat.member] = beat

    def beats(self) -> dict[str, MemberBeat]:
        return dict(self.heartbeats)

    def beat_of(self, member: str) -> MemberBeat | None:
        return self.heartbeats.get(member)

    def unreadable(self) -> dict[str, Refusal]:
        return dict(self.refused)

    def forget(self, member: str) -> None:
        self.heartbeats.pop(member, None)
