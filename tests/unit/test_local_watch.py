"""The local store's event job runs until shutdown, whatever the store dir does."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from controlplane.adapters.stores.local_watch import watch_local_store
from tests.support.polling import until

DEADLINE = 10.0


async def _woken(wake: asyncio.Event, what: str) -> None:
    try:
        async with asyncio.timeout(DEADLINE):
            await wake.wait()
    except TimeoutError:
        raise AssertionError(f"not woken within {DEADLINE} s: {what}") from None
    wake.clear()


def test_a_store_that_does_not_exist_yet_is_watched_once_it_appears(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A missing store dir used to end the job at once, and the supervisor restarted it
    every few seconds, logging an error each time."""

    async def scenario() -> None:
        root = tmp_path / "store"
        wake = asyncio.Event()
        job = asyncio.create_task(watch_local_store(root, wake, appear_poll=0.05))
        try:
            await until(
                lambda: any("looking for it every" in m for m in caplog.messages),
                "the job said it looks for the store dir",
            )
            assert not job.done()  # it looks again rather than end
            root.mkdir()
            await _woken(wake, "the store dir appeared")
            for attempt in range(50):  # the watch starts a moment after the wake-up
                (root / f"model-{attempt}").mkdir()
                try:
                    async with asyncio.timeout(0.5):
                        await wake.wait()
                    break
                except TimeoutError:
                    continue
            assert wake.is_set(), "no event for a new dir in the store"
            assert not job.done()
        finally:
            job.cancel()

    asyncio.run(scenario())
