"""The supervisor of the daemon's background jobs: reconcile, the release watcher, the
overload watcher, the store's file watch.

Each job runs forever in its own task; one that raises (an ``OSError`` from a full disk, a
``sqlite3`` error, a bug) is logged with its traceback, counted
(``controlplane_job_restarts_total{name}``) and started again after a backoff that doubles up to
a bound and resets once the job has run well for a while. A failing job never stops the others
(auto-rollback keeps working while the release watcher fails), and health says which job is
down and why. Shutdown cancels them all and waits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from controlplane.ports import Clock, Telemetry
from controlplane.services.telemetry import NO_TELEMETRY
from controlplane.timing import Backoff

log = logging.getLogger(__name__)
HEALTHY_RUN = 60.0  # a job that ran this long before failing starts again from the first backoff
RESTART = Backoff(first=1.0, limit=30.0)


class JobState(StrEnum):
    RUNNING = "running"
    BACKING_OFF = "backing_off"  # it failed; it starts again at ``restart_at``
    STOPPED = "stopped"


@dataclass(frozen=True)
class JobStatus:
    name: str
    state: JobState
    restarts: int = 0
    last_error: str | None = None
    since: datetime | None = None
    restart_at: datetime | None = None

    @property
    def down(self) -> bool:
        return self.state is not JobState.RUNNING


Job = Callable[[], Awaitable[None]]


class Supervisor:
    def __init__(
        self,
        clock: Clock,
        telemetry: Telemetry = NO_TELEMETRY,
        *,
        backoff: Backoff = RESTART,
    ) -> None:
        self._clock = clock
        self._telemetry = telemetry
        self._backoff = backoff
        self._jobs: dict[str, Job] = {}
        self._status: dict[str, JobStatus] = {}

    def add(self, name: str, job: Job) -> None:
        if name in self._jobs:
            raise ValueError(f"a job named {name!r} is supervised already")
        self._jobs[name] = job
        self._status[name] = JobStatus(name, JobState.STOPPED, since=self._clock.now())

    def statuses(self) -> list[JobStatus]:
        return [self._status[name] for name in self._jobs]

    def health(self) -> dict[str, bool]:
        """Whether each job runs, by name (``/metrics``)."""
        return {status.name: not status.down for status in self.statuses()}

    def down(self) -> list[JobStatus]:
        return [status for status in self.statuses() if status.down]

    async def run(self) -> None:
        """Run every job until cancelled (shutdown)."""
        try:
            async with asyncio.TaskGroup() as group:
                for name, job in self._jobs.items():
                    group.create_task(self._keep(name, job), name=f"job-{name}")
        finally:
            for name in self._jobs:
                self._set(name, state=JobState.STOPPED, restart_at=None)

    async def _keep(self, name: str, job: Job) -> None:
        backoff: float | None = None  # the delay of the last restart; None: none lately
        while True:
            self._set(name, state=JobState.RUNNING, since=self._clock.now(), restart_at=None)
            started = self._clock.monotonic()
            try:
                await job()
                error = "it returned, but it should run until shutdown"
                log.error("job %s ended on its own; starting it again", name)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                backoff = self._next(backoff, started)
                log.exception(
                    "job %s failed (%s); starting it again in %.1f s", name, error, backoff
                )
            else:
                backoff = self._next(backoff, started)
            self._telemetry.job_restarted(name)
            restart_at = self._clock.now() + timedelta(seconds=backoff)
            status = self._status[name]
            self._set(
                name,
                state=JobState.BACKING_OFF,
                restarts=status.restarts + 1,
                last_error=error,
                since=self._clock.now(),
                restart_at=restart_at,
            )
            await self._clock.sleep(backoff)

    def _next(self, last: float | None, started: float) -> float:
        """The restart's delay: the first again after a job that ran well for a while."""
        ran_well = self._clock.monotonic() - started >= HEALTHY_RUN
        return self._backoff.after(None if ran_well else last)

    def _set(self, name: str, **changes: Any) -> None:
        self._status[name] = replace(self._status[name], **changes)
