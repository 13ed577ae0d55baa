"""Fixtures for tests against the real Triton and the real daemon process."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from devtools.launcher import RunningTriton
from tests.support.daemon import Daemon, start_daemon
from tests.support.models import write_scale_release
from tests.support.polling import eventually
from tests.support.stopping import stop_all
from tests.support.triton_pool import TritonPool

_names = itertools.count()


class DaemonFactory(Protocol):
    def __call__(self, store: Path, **kwargs: Any) -> Daemon: ...


@pytest.fixture
def model_name(request: pytest.FixtureRequest) -> str:
    """A model name unique in the session, since tests share one Triton."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40]
    return f"{base.strip('-')}-{os.getpid()}-{next(_names)}"


@pytest.fixture(scope="session")
def triton_pool(
    triton_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonPool]:
    """Tritons kept for the session and lent to fleet members (tests/support/triton_pool.py)."""
    pool = TritonPool(tmp_path_factory.mktemp("triton-pool"), triton_cache)
    yield pool
    pool.stop()


@pytest.fixture
def pooled_tritons(triton_pool: TritonPool) -> Iterator[Callable[[Path], RunningTriton]]:
    """Lend this test Tritons from the pool, one a call, for a fleet's members (the repository
    dir a member would start its own Triton on stays unused: a pooled one has its own). Given
    back at teardown, after the fixtures that use them (a fleet's daemons) have stopped."""
    lent: list[RunningTriton] = []

    def lend(_unused_repository: Path) -> RunningTriton:
        lent.append(triton_pool.lend())
        return lent[-1]

    yield lend
    triton_pool.give_back(lent)


@pytest.fixture
def daemons(triton: RunningTriton, tmp_path: Path) -> Iterator[DaemonFactory]:
    """Start daemons against the session Triton; each is stopped at teardown."""
    started: list[Daemon] = []

    def start(store: Path, **kwargs: Any) -> Daemon:
        kwargs.setdefault("triton", triton)
        workdir = tmp_path / f"daemon-{len(started)}"
        workdir.mkdir(exist_ok=True)
        daemon = start_daemon(store=store, workdir=kwargs.pop("workdir", workdir), **kwargs)
        started.append(daemon)
        return daemon

    yield start
    stop_all(started, Daemon.stop)


def serving_r2(
    daemons: DaemonFactory, store: Path, model: str, *, config: str, token: str | None = None
) -> Daemon:
    """A daemon serving r2 (answers 2x) with r1 (1x) as the previous, warm release."""
    write_scale_release(store, model, "r1", k=1.0)
    write_scale_release(store, model, "r2", k=2.0)
    daemon = daemons(store, config=config, token=token)
    if token is not None:
        daemon.headers["authorization"] = f"Bearer {token}"
    for release in ("r1", "r2"):
        response = daemon.deploy(model, release)
        assert response.status_code == 200, response.text
    return daemon


def rollback_operations(daemon: Daemon, model: str) -> list[tuple[str, str]]:
    """(trigger, status) of the model's rollback operations, newest first."""
    operations = daemon.get(f"/v1/operations?model={model}&limit=50").json()["operations"]
    return [(op["trigger"], op["status"]) for op in operations if op["kind"] == "rollback"]


def last_rollback(daemon: Daemon, model: str) -> dict[str, Any]:
    """The model's last rollback record, once written: the record is saved when the rollback's
    operation has ended, a moment after the switch that clients see."""

    def record() -> dict[str, Any] | None:
        found: dict[str, Any] | None = daemon.get(f"/v1/models/{model}").json()["rollback"]["last"]
        return found

    eventually(lambda: record() is not None, 10, f"the rollback record of {model}")
    found = record()
    assert found is not None
    return found
