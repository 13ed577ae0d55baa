"""The fleet bench's members: a Triton of its own per member, its daemon started as users start
it, and the one call the bench makes through the API.

Members are built with the tests' :class:`~tests.support.fleet.Fleet` (one Triton per member
with its own repository, ``controlplane serve`` on the shared store with
``CONTROLPLANE_FLEET__MEMBER``), started in parallel and waited for together. Every Triton
started here is stopped by :meth:`Tritons.stop`, after the daemons.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import httpx

from bench.hot_swap import cache_dir
from controlplane.adapters.triton.launcher import RunningTriton, TritonPorts, launch_triton
from tests.support.fleet import Member

POLL_ENV = "CONTROLPLANE_STORE__POLL_INTERVAL_SECONDS"
BEAT_ENV = "CONTROLPLANE_FLEET__HEARTBEAT_SECONDS"


def intervals(poll: float, beat: float) -> dict[str, str]:
    """The environment that sets a member's poll and heartbeat intervals (the tests' Fleet
    would otherwise set 1 s for both)."""
    return {POLL_ENV: f"{poll:g}", BEAT_ENV: f"{beat:g}"}


class Tritons:
    """Starts a Triton per member (the tests' ``TritonFactory``) and stops every one it started."""

    def __init__(self) -> None:
        self.started: list[RunningTriton] = []

    def __call__(
        self,
        repository: Path,
        *,
        ports: TritonPorts | None = None,
        extra_args: Sequence[str] = (),
    ) -> RunningTriton:
        running = launch_triton(
            repository,
            cache_dir=cache_dir(),
            ports=ports,
            log_path=repository.parent / "triton.log",
            extra_args=extra_args,
        )
        self.started.append(running)
        return running

    def stop(self) -> None:
        for running in reversed(self.started):
            running.stop()
        self.started.clear()


def wait_ready(members: Sequence[Member], timeout: float) -> None:
    """Every member's daemon answers /readyz with 200 (they start in parallel)."""
    deadline = time.perf_counter() + timeout
    waiting = list(members)
    while waiting:
        for member in list(waiting):
            if member.api.process.poll() is not None:
                raise RuntimeError(f"{member.name}'s daemon exited:\n{member.api.log()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if member.api.get("/readyz").status_code == 200:
                    waiting.remove(member)
        if waiting and time.perf_counter() > deadline:
            raise TimeoutError(f"not ready after {timeout:g} s: {[m.name for m in waiting]}")
        time.sleep(0.2)


def fleet_deploy(member: Member, model: str, release: str) -> httpx.Response:
    """The call a user makes: deploy through ``member`` and wait for every live member."""
    body = {"release": release, "wait": True, "fleet": True, "fleet_timeout_seconds": 300}
    return member.api.http.post(f"/v1/models/{model}/deploy", json=body)


def deployed(member: Member, model: str, release: str) -> None:
    """:func:`fleet_deploy`, raising with the daemon's answer unless it succeeded."""
    answer = fleet_deploy(member, model, release)
    if answer.status_code != 200:
        raise RuntimeError(f"deploy {model} {release} via {member.name}: {answer.text[:2000]}")


def log_problems(members: Sequence[Member]) -> Counter[str]:
    """The warnings and errors in the members' daemon logs (JSON lines), by message."""
    found: Counter[str] = Counter()
    for member in members:
        if member.daemon is None or not member.daemon.log_path.exists():
            continue
        for line in member.daemon.log().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and record.get("level") in ("warning", "error"):
                    message = str(record.get("message", ""))[:200]
                    found[f"{record['level']} {record.get('logger', '')}: {message}"] += 1
    return found
