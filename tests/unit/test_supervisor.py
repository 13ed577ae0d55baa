"""The supervisor: a background job that fails is logged, counted and started again, and the
others (automatic rollback among them) go on meanwhile.

The jobs are the daemon's own (the release watcher over a store that raises, the overload
watcher over scripted GPU readings); only what cannot happen on cue is a fake injected
through its Protocol: the store's failure and the GPU.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from controlplane.domain.checksums import FileDigest
from controlplane.domain.ignored import IgnoredName
from controlplane.domain.releases import ReleaseInfo
from controlplane.domain.rollback import RollbackOutcome
from controlplane.ports import FetchedRelease, FetchProgress, MarkerFiles, ReleaseListing
from controlplane.services.supervisor import JobState, Supervisor
from controlplane.services.telemetry import NoTelemetry
from controlplane.timing import Backoff
from tests.support.fakes import FakeClock, release_watcher
from tests.support.polling import until
from tests.unit.test_auto_rollback import rig
from tests.unit.test_bluegreen_service import MODEL
from tests.unit.test_overload_watcher import ScriptedSource, _watcher


class CountingTelemetry(NoTelemetry):
    def __init__(self) -> None:
        self.restarts: list[str] = []

    def job_restarted(self, job: str) -> None:
        self.restarts.append(job)


class FullDiskStore:
    """A store whose listing fails as a full disk or a lost mount does: ``OSError``."""

    uri = "file:///models"

    def close(self) -> None:
        return None

    def list_models(self, *, ignored: Callable[[IgnoredName], None] | None = None) -> list[str]:
        raise OSError(28, "No space left on device")

    def list_releases(
        self, model: str, *, ignored: Callable[[IgnoredName], None] | None = None
    ) -> list[ReleaseInfo]:
        raise OSError(28, "No space left on device")

    def list_store(
        self, *, ignored: Callable[[str | None, IgnoredName], None] | None = None
    ) -> dict[str, list[ReleaseInfo]]:
        raise OSError(28, "No space left on device")

    def describe(self, model: str, release: str, *, patient: bool = False) -> ReleaseInfo:
        raise OSError(28, "No space left on device")

    def read_marker_files(self, model: str, release: str) -> MarkerFiles:
        raise OSError(28, "No space left on device")

    def list_files(self, model: str, release: str) -> ReleaseListing:
        raise OSError(28, "No space left on device")

    def confirm(
        self,
        listing: ReleaseListing,
        rel: str,
        sha256: str,
        cancel: threading.Event | None = None,
    ) -> bool:
        raise OSError(28, "No space left on device")

    def fetch(
        self,
        listing: ReleaseListing,
        dest: Path,
        *,
        manifest: Mapping[str, str] | None,
        have: Mapping[str, FileDigest] | None = None,
        progress: Callable[[FetchProgress], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> FetchedRelease:
        raise OSError(28, "No space left on device")


def test_a_failing_job_is_restarted_and_counted_while_automatic_rollback_works(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            await r.serving_r2()
            telemetry = CountingTelemetry()
            supervisor = Supervisor(r.parts.clock, telemetry, backoff=Backoff(0.01, 0.02))
            watcher = release_watcher(
                r.service,
                r.parts,
                store=FullDiskStore(),
                auto_deploy=lambda _model: True,
                interval=0.01,
            )
            overload = _watcher(r, ScriptedSource({"gpu0": 0.99}))

            supervisor.add("release-watcher", watcher.run)
            supervisor.add("overload-watcher", overload.run)
            jobs = asyncio.create_task(supervisor.run())
            try:

                async def rolled_back() -> bool:
                    last = await r.parts.repos.rollbacks.last(MODEL)
                    return last is not None and last.outcome is RollbackOutcome.FALLBACK

                async with r.parts.clock.autojump():  # the beats and the backoffs pass
                    await until(
                        lambda: telemetry.restarts.count("release-watcher") >= 3, "restarts"
                    )
                    await until(rolled_back, "the automatic rollback", timeout=10.0)
                statuses = {s.name: s for s in supervisor.statuses()}
                failing = statuses["release-watcher"]
                assert failing.restarts >= 3
                assert failing.last_error == "OSError: [Errno 28] No space left on device"
                assert statuses["overload-watcher"].state is JobState.RUNNING
                assert statuses["overload-watcher"].restarts == 0
                assert "overload-watcher" not in telemetry.restarts
            finally:
                jobs.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await jobs
            assert {s.state for s in supervisor.statuses()} == {JobState.STOPPED}

    with caplog.at_level(logging.ERROR):
        asyncio.run(scenario())
    failures = [r for r in caplog.records if "job release-watcher failed" in r.getMessage()]
    assert failures
    assert failures[0].exc_info is not None  # the traceback is in the log


def test_a_job_that_ends_on_its_own_is_started_again() -> None:
    async def scenario() -> int:
        runs = 0

        async def short() -> None:
            nonlocal runs
            runs += 1

        telemetry = CountingTelemetry()
        clock = FakeClock()
        supervisor = Supervisor(clock, telemetry, backoff=Backoff(0.001, 0.001))
        supervisor.add("short", short)
        jobs = asyncio.create_task(supervisor.run())
        async with clock.autojump():
            await until(lambda: runs >= 3, "three runs")
        jobs.cancel()
        with pytest.raises(asyncio.CancelledError):
            await jobs
        assert telemetry.restarts[:2] == ["short", "short"]
        return runs

    assert asyncio.run(scenario()) >= 3


def test_backoff_doubles_up_to_its_bound_and_is_visible() -> None:
    async def scenario() -> dict[int, float]:
        waits: dict[int, float] = {}  # restart number -> the wait before it

        async def failing() -> None:
            raise RuntimeError("broken")

        clock = FakeClock()
        supervisor = Supervisor(clock, backoff=Backoff(0.05, 0.2))
        supervisor.add("broken", failing)
        jobs = asyncio.create_task(supervisor.run())

        for _ in range(4):  # each restart waits on the clock: look, then let it pass
            await clock.sleeping()
            status = supervisor.statuses()[0]
            assert status.state is JobState.BACKING_OFF
            assert status.restart_at is not None
            assert status.since is not None
            waits[status.restarts] = (status.restart_at - status.since).total_seconds()
            await clock.step()
        jobs.cancel()
        with pytest.raises(asyncio.CancelledError):
            await jobs
        return waits

    waits = asyncio.run(scenario())
    assert [waits[n] for n in (1, 2, 3, 4)] == [0.05, 0.1, 0.2, 0.2]
