"""What the API holds: every service and adapter the daemon built, released by ``close``.

The app keeps one :class:`Container` for its lifetime; routes read their services from it.
``close`` stops the work first (the operation runner, then the owned tasks) and releases the
clients and files after, so nothing running still uses a closed one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.adapters.persistence import SqliteRepos
from controlplane.adapters.telemetry import PrometheusTelemetry
from controlplane.adapters.triton.driver import TritonDriver
from controlplane.adapters.triton.metrics import TritonMetrics
from controlplane.domain.notifications import NotificationHealth
from controlplane.ports import ModelStore, UtilizationSource
from controlplane.services.alerts import AlertReceiver
from controlplane.services.deploy import DeployService
from controlplane.services.figures import FigureReader
from controlplane.services.fleet import FleetService
from controlplane.services.fleet_sync import FleetSync
from controlplane.services.memory import MemoryWatch
from controlplane.services.operations import OperationClient
from controlplane.services.overload import OverloadWatcher
from controlplane.services.overview import OverviewService
from controlplane.services.reconcile import Reconciler
from controlplane.services.rollback import AutoRollback
from controlplane.services.rollout_controls import RolloutControls
from controlplane.services.rotation import Rotation
from controlplane.services.runner import OperationRunner
from controlplane.services.status import StatusService
from controlplane.services.supervisor import Supervisor
from controlplane.services.tasks import TaskOwner
from controlplane.services.watcher import ReleaseWatcher
from controlplane.settings import Settings


@dataclass
class Container:
    """Everything the API needs, built once; ``close`` releases it."""

    settings: Settings
    deploy: DeployService
    client: OperationClient  # the one way to start an operation and see it end
    status: StatusService
    reconciler: Reconciler
    runner: OperationRunner
    tasks: TaskOwner
    triton: TritonDriver
    repos: SqliteRepos
    ready: asyncio.Event
    watcher: ReleaseWatcher
    store: ModelStore
    rollback: AutoRollback
    alerts: AlertReceiver
    overload: OverloadWatcher | None
    memory: MemoryWatch
    telemetry: PrometheusTelemetry
    supervisor: Supervisor
    readers: list[TritonMetrics | UtilizationSource]  # HTTP clients, one per URL
    overview: OverviewService  # the status page's data
    figures: FigureReader  # what /metrics shows of the present
    rotation: Rotation  # the models that keep this member out of rotation now (/readyz)
    fleet: FleetSync | None = None  # None: fleet.enabled is false
    fleet_view: FleetService | None = None
    rollout: RolloutControls | None = None  # pause, resume, promote, abort (None: no fleet)
    notifications: Callable[[], NotificationHealth] | None = None  # None: no SQS queue

    async def close(self) -> None:
        await self.runner.close()
        await self.tasks.close()
        await self.triton.close()
        for reader in self.readers:
            await reader.close()
        self.store.close()
        self.repos.close()
