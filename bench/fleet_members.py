"""The fleet bench's members and their clients: a Triton of its own per member, its daemon
started as users start it, the one call the bench makes through the API, and gRPC clients that
see what each member's Triton serves.

Members are built with the tests' :class:`~tests.support.fleet.Fleet` (one Triton per member
with its own repository, ``controlplane serve`` on the shared store with
``CONTROLPLANE_FLEET__MEMBER``), started in parallel and waited for together. Every Triton
started here is stopped by :meth:`Tritons.stop`, after the daemons.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import httpx
import numpy as np
import tritonclient.grpc as grpcclient

from bench.hot_swap import Request, cache_dir
from bench.rollback import wait_until
from devtools.launcher import RunningTriton, TritonPorts, launch_triton
from tests.support.fleet import Member

POLL_ENV = "CONTROLPLANE_STORE__POLL_INTERVAL_SECONDS"
BEAT_ENV = "CONTROLPLANE_FLEET__KEEPALIVE_SECONDS"
PROBLEMS = ("warning", "error")  # the levels log_problems reports


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


def fleet_deploy(http: httpx.Client, model: str, release: str) -> httpx.Response:
    """The call a user makes: deploy through the member ``http`` talks to and wait for every
    live member (the daemon gives up before the client's 120 s do).

    Pass a client with a fresh connection (:meth:`Daemon.client`), built before any clock
    starts: a kept-alive connection idle for about uvicorn's keep-alive timeout (5 s) may be
    closed by the daemon as the request goes out."""
    body = {"release": release, "wait": True, "fleet": True, "fleet_timeout_seconds": 100}
    return http.post(f"/v1/models/{model}/deploy", json=body)


def deployed(member: Member, model: str, release: str) -> None:
    """:func:`fleet_deploy` through ``member``, raising with the daemon's answer unless it
    succeeded."""
    with member.api.client() as http:
        answer = fleet_deploy(http, model, release)
    if answer.status_code != 200:
        raise RuntimeError(f"deploy {model} {release} via {member.name}: {answer.text[:2000]}")


def log_problems(members: Sequence[Member], since: datetime | None = None) -> Counter[str]:
    """The warnings and errors in the members' daemon logs (JSON lines), by message; with
    ``since`` (aware), only those logged from then on."""
    found: Counter[str] = Counter()
    for member in members:
        if member.daemon is None or not member.daemon.log_path.exists():
            continue
        for line in member.daemon.log().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if not isinstance(record, dict) or record.get("level") not in PROBLEMS:
                    continue
                if (
                    since is not None
                    and datetime.fromisoformat(str(record.get("time", ""))) < since
                ):
                    continue
                message = str(record.get("message", ""))[:200]
                found[f"{record['level']} {record.get('logger', '')}: {message}"] += 1
    return found


# --- clients -------------------------------------------------------------------------------


class MemberClients:
    """``clients`` gRPC clients spread over the members' Tritons (at least one each), each
    paced at one request every ``every`` s (back to back when one takes longer), until stopped.

    The same number of clients for every fleet size: on one machine, more clients would slow
    every deploy of a larger fleet, the receiving member's too."""

    def __init__(
        self, urls: Sequence[str], model: str, clients: int, every: float, seconds: float
    ) -> None:
        self.member_of = [i % len(urls) for i in range(max(clients, len(urls)))]
        self.logs: list[list[Request]] = [[] for _ in self.member_of]
        self.errors: list[str] = []
        self._urls, self._model, self._every = urls, model, every
        self._stop = threading.Event()
        self._deadline = time.perf_counter() + seconds
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True)
            for i in range(len(self.logs))
        ]

    def __enter__(self) -> MemberClients:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def first(self, member: int, value: float) -> float | None:
        """When ``member``'s clients first got ``value``: the end of that request."""
        ends = [
            next((r.end for r in log if r.value == value), None)
            for log, of in zip(self.logs, self.member_of, strict=True)
            if of == member
        ]
        found = [end for end in ends if end is not None]
        return min(found) if found else None

    def settle(self, answers: int, timeout: float) -> None:
        """Every client gets ``answers`` more answers than now."""
        start = [len(log) for log in self.logs]
        wait_until(
            lambda: all(len(log) - s >= answers for log, s in zip(self.logs, start, strict=True)),
            timeout,
            "every client answering",
            every=0.01,
        )

    def _run(self, index: int) -> None:
        client = grpcclient.InferenceServerClient(self._urls[self.member_of[index]])
        tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        log = self.logs[index]
        beat = time.perf_counter() + random.uniform(0, self._every)  # clients out of step
        try:
            while not self._stop.is_set() and time.perf_counter() < self._deadline:
                time.sleep(max(0.0, beat - time.perf_counter()))
                beat = max(beat + self._every, time.perf_counter())
                start = time.perf_counter()
                value: float | None = None
                try:
                    output = client.infer(self._model, [tensor], client_timeout=30.0)
                    value = float(output.as_numpy("OUTPUT0")[0])
                except Exception as exc:  # every failure is what the bench counts
                    self.errors.append(repr(exc)[:200])
                log.append(Request(start, time.perf_counter(), value))
        finally:
            client.close()


def counts(clients: MemberClients, new: float, old: float) -> dict[str, float]:
    """Failed requests, answers that went back to ``old`` after ``new``, answers of neither."""
    back = unexpected = 0
    for log in clients.logs:
        moved = False
        for request in log:
            unexpected += request.value not in (None, new, old)
            back += moved and request.value == old
            moved = moved or request.value == new
    everything = [r for log in clients.logs for r in log]
    return {
        "requests": float(len(everything)),
        "failed": float(sum(r.value is None for r in everything)),
        "back": float(back),
        "unexpected": float(unexpected),
    }
