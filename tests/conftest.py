"""Fixtures every test layer shares: the real Triton and an empty model store.

One Triton serves the whole session (`triton`) because starting it costs seconds; tests that
share it use unique model names. Tests that must restart or break Triton start their own with
`own_triton`. Every Triton started here is stopped at teardown, so none outlives the run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

import pytest

from devtools.launcher import RunningTriton, TritonPorts, launch_triton
from tests.support.stopping import stop_all


class TritonFactory(Protocol):
    """Starts a Triton of the test's own on `repository`; `ports` to restart on the same ones."""

    def __call__(
        self,
        repository: Path,
        *,
        ports: TritonPorts | None = None,
        extra_args: Sequence[str] = (),
    ) -> RunningTriton: ...


@pytest.fixture(scope="session")
def triton_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the server tree is prepared; a stable dir when possible so runs reuse the copy."""
    stable = Path.home() / ".cache" / "controlplane-tests"
    try:
        stable.mkdir(parents=True, exist_ok=True)
    except OSError:
        return tmp_path_factory.mktemp("triton-cache")
    if not os.access(stable, os.W_OK | os.X_OK):
        return tmp_path_factory.mktemp("triton-cache")
    return stable


@pytest.fixture(scope="session")
def triton_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session Triton's root: `<root>/repository` is its model repository."""
    root = tmp_path_factory.mktemp("root")
    (root / "repository").mkdir()
    return root


@pytest.fixture(scope="session")
def triton(
    triton_root: Path, triton_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningTriton]:
    """One Triton (EXPLICIT mode) on `triton_root/repository` for the whole session."""
    log_path = tmp_path_factory.mktemp("triton-logs") / "session-triton.log"
    with launch_triton(
        triton_root / "repository", cache_dir=triton_cache, log_path=log_path
    ) as running:
        yield running


@pytest.fixture
def own_triton(triton_cache: Path, tmp_path: Path) -> Iterator[TritonFactory]:
    """Start Tritons that belong to this test; all of them are stopped at its teardown."""
    started: list[RunningTriton] = []

    def start(
        repository: Path,
        *,
        ports: TritonPorts | None = None,
        extra_args: Sequence[str] = (),
    ) -> RunningTriton:
        running = launch_triton(
            repository,
            cache_dir=triton_cache,
            ports=ports,
            log_path=tmp_path / f"own-triton-{len(started)}.log",
            extra_args=extra_args,
        )
        started.append(running)
        return running

    yield start
    stop_all(started, RunningTriton.stop)  # side by side: each waits for its models to unload


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """An empty local model store (`<store>/<model>/<release>/`)."""
    path = tmp_path / "store"
    path.mkdir()
    return path
