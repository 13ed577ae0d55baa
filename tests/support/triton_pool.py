"""Tritons shared by the fleet tests of a session, instead of three started and stopped per test.

A fleet member needs a Triton of its own beside its daemon, but no fleet test kills or restarts
one: members only load and unload models in it. So the session keeps a pool, each Triton on a
repository of its own, and lends them out in the order they were started (a test's first
member gets the first one). Tests lending from it use model names no other test of the session
uses (:func:`unique_model`), so what an earlier test left in a Triton is never theirs.

When a test gives its Tritons back (its daemons stopped first), the models it left loaded are
unloaded, so that idle Python-backend stubs do not pile up over the session; Triton unloads in
the background, and nothing waits for it. A Triton that died or does not answer is not lent
again. Tests that
kill or restart Triton start their own (``own_triton``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from pathlib import Path

import httpx

from devtools.launcher import RunningTriton, launch_triton
from tests.support.stopping import stop_all

_models = itertools.count(1)


def unique_model(prefix: str) -> str:
    """A model name used once in this session (and this worker's process): ``<prefix>-<n>``."""
    return f"{prefix}-{os.getpid() % 100_000}-{next(_models)}"


class TritonPool:
    """Tritons started on demand and kept for the session; `stop` ends them all."""

    def __init__(self, root: Path, cache_dir: Path) -> None:
        self._root = root
        self._cache_dir = cache_dir
        self._started: list[RunningTriton] = []
        self._idle: list[RunningTriton] = []

    def lend(self) -> RunningTriton:
        """The first idle, live Triton, or a new one."""
        while self._idle:
            triton = self._idle.pop(0)
            if triton.process.poll() is None:
                return triton
        where = self._root / f"triton-{len(self._started)}"
        (where / "repository").mkdir(parents=True)
        triton = launch_triton(
            where / "repository", cache_dir=self._cache_dir, log_path=where / "triton.log"
        )
        self._started.append(triton)
        return triton

    def give_back(self, tritons: Sequence[RunningTriton]) -> None:
        """Unload what the test left loaded; then the Tritons are idle again, in start order."""
        kept = []
        for triton in tritons:
            try:
                _unload_everything(triton)
            except httpx.HTTPError:
                triton.stop()  # dead or not answering: not lent again
            else:
                kept.append(triton)
        returned = {id(t) for t in [*self._idle, *kept]}
        self._idle = [t for t in self._started if id(t) in returned]

    def stop(self) -> None:
        """Stop every Triton started, all at once (each waits for its models to unload)."""
        stop_all(self._started, RunningTriton.stop)


def _unload_everything(triton: RunningTriton) -> None:
    """Ask Triton to unload every model it has loaded; it answers before it is done."""
    with httpx.Client(base_url=triton.http_url, timeout=10.0, trust_env=False) as client:
        index = client.post("/v2/repository/index", json={"ready": True})
        index.raise_for_status()
        for entry in index.json():
            name = entry["name"]
            client.post(f"/v2/repository/models/{name}/unload", json={}).raise_for_status()
