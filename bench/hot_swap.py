"""Hot swap under load: what a deploy through the daemon costs on top of Triton's own reload.

The daemon promises boring model updates: no failed request, answers that only move forward,
and little time added to what Triton needs anyway to load the new release. This bench measures
all three against the real bundled Triton (EXPLICIT mode, CPU) and the real daemon process.

One run, with N client threads sending gRPC inference to the model back to back:

* K swaps through the daemon (`deploy(model, r_i, wait=True)`): wall time around the HTTP call,
  and the operation's own steps (resolve, fetch, verify, place, load, record).
* The baseline, interleaved with those swaps under the same load: Triton alone reloading the
  same release under a second model name (a fresh copy with new mtimes, swapped into the
  repository by rename, then `load_model`). `deploy - baseline` for the same release is the
  daemon's overhead. Daemon and baseline alternate which goes first, so neither always runs
  right after the other's clean-up.
* Every request's start, end and answer: failed requests, answers that go back to an older
  release, answers still from an older release after the deploy returned, and latency p50/p99
  of requests that overlapped a deploy vs requests that overlapped no swap at all.

Machines are noisy (2-core VMs, CI runners, laptops), so the reported numbers are medians over
runs of per-run medians, with the spread across runs, and ratios against a baseline measured in
the same run. Counts of bad requests are totals over all runs: the target for them is 0.

Run from the repo root: `.venv/bin/python bench/hot_swap.py [--write-readme]` (`make bench`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import numpy as np
import tritonclient.grpc as grpcclient

from bench.report import README, machine, run_main, section, table, verdict, write_readme
from devtools.launcher import RunningTriton, launch_triton
from tests.support.daemon import Daemon, start_daemon
from tests.support.models import write_scale_release

MODEL = "hotswap"
BASELINE = "hotswap-baseline"
OWN_STEPS = ("resolve", "fetch", "verify", "place", "record")


# --- load ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    start: float  # time.perf_counter(), like every interval here
    end: float
    value: float | None  # None: the request failed


class TimedLoad:
    """N threads calling `model` back to back until stopped or `max_seconds` passed."""

    def __init__(self, url: str, model: str, clients: int, max_seconds: float) -> None:
        self._url, self._model = url, model
        self._stop = threading.Event()
        self._deadline = time.perf_counter() + max_seconds
        self.requests: list[list[Request]] = [[] for _ in range(clients)]
        self.errors: list[str] = []
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)
        ]

    def __enter__(self) -> TimedLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def settle(self, answers: int, seconds: float, timeout: float = 60.0) -> None:
        """Wait `seconds`, and until every client has `answers` more requests than now."""
        start = [len(log) for log in self.requests]
        until = time.perf_counter() + seconds
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < until or any(
            len(log) - s < answers for log, s in zip(self.requests, start, strict=True)
        ):
            if time.perf_counter() > deadline:
                raise RuntimeError("clients made no progress")
            time.sleep(0.01)

    def _run(self, index: int) -> None:
        client = grpcclient.InferenceServerClient(self._url)
        tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        log = self.requests[index]
        try:
            while not self._stop.is_set() and time.perf_counter() < self._deadline:
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


# --- one run -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Swap:
    release: int
    deploy: tuple[float, float]
    steps: dict[str, float]
    baseline: tuple[float, float]
    baseline_copy: float
    operation_s: float  # created -> finished, as the daemon records the operation

    @property
    def deploy_s(self) -> float:
        return self.deploy[1] - self.deploy[0]

    @property
    def baseline_s(self) -> float:
        return self.baseline[1] - self.baseline[0]

    @property
    def own_steps_s(self) -> float:
        return sum(self.steps.get(name, 0.0) for name in OWN_STEPS)

    @property
    def outside_steps_s(self) -> float:
        """Wall time no step accounts for: HTTP, bookkeeping between steps, clean-up."""
        return self.deploy_s - sum(self.steps.values())


@dataclass
class Bench:
    """Everything one bench process set up, and the knobs of its runs."""

    triton: RunningTriton
    daemon: Daemon
    store: Path
    scratch: Path  # beside the repository: same filesystem, outside Triton's view
    swaps: int
    clients: int
    settle: float
    deadline: float
    control: Any = field(init=False)  # tritonclient's gRPC client, for the baseline's loads
    http: httpx.Client = field(init=False)  # the daemon's API, kept alive across deploys

    def __post_init__(self) -> None:
        self.control = grpcclient.InferenceServerClient(self.triton.grpc_url)
        self.http = self.daemon.client()

    def remaining(self) -> float:
        left = self.deadline - time.perf_counter()
        if left <= 0:
            raise TimeoutError("the bench ran past its --timeout")
        return left


def deploy(bench: Bench, release: str) -> tuple[dict[str, float], float]:
    """Deploy through the daemon and wait; returns the step durations and the operation's."""
    # One kept-alive client, not `Daemon.deploy`'s client per call: building an httpx.Client
    # (its SSL context) costs 40+ ms here, which would be charged to the daemon.
    response = bench.http.post(
        f"/v1/models/{MODEL}/deploy", json={"release": release, "wait": True}
    )
    if response.status_code != 200:
        raise RuntimeError(f"deploy of {release} failed: {response.status_code} {response.text}")
    operation = response.json()["operation"]
    steps = {str(s["name"]): float(s["duration_seconds"] or 0.0) for s in operation["steps"]}
    return steps, float(operation["duration_seconds"] or 0.0)


def place_baseline(bench: Bench, release: str) -> float:
    """Copy a release in as BASELINE with fresh mtimes, the way a hand deploy would; seconds."""
    began = time.perf_counter()
    source = bench.store / MODEL / release
    fresh = bench.scratch / f"new-{uuid.uuid4().hex}"
    for path in sorted(source.rglob("*")):
        target = fresh / path.relative_to(source)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif path.name != "SHA256SUMS":
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)  # contents only: new mtimes, so Triton reloads
    config = fresh / "config.pbtxt"
    text = re.sub(r'(?m)^name:\s*".*"$', f'name: "{BASELINE}"', config.read_text("utf-8"), count=1)
    config.write_text(text, encoding="utf-8")
    live = bench.triton.repository / BASELINE
    old = bench.scratch / f"old-{uuid.uuid4().hex}"
    if live.exists():
        live.rename(old)
    fresh.rename(live)
    shutil.rmtree(old, ignore_errors=True)
    return time.perf_counter() - began


def run_once(bench: Bench, run: int) -> tuple[list[Swap], TimedLoad]:
    deploy(bench, "r0")  # every run starts from r0; not measured
    client = bench.control
    with TimedLoad(bench.triton.grpc_url, MODEL, bench.clients, bench.remaining()) as load:
        load.settle(answers=5, seconds=bench.settle)
        swaps = []
        for i in range(1, bench.swaps + 1):
            release = f"r{i}"
            copy = place_baseline(bench, release)
            steps: dict[str, float] = {}
            operation = 0.0
            spans: dict[str, tuple[float, float]] = {}
            for who in ("daemon", "triton") if i % 2 else ("triton", "daemon"):
                start = time.perf_counter()
                if who == "daemon":
                    steps, operation = deploy(bench, release)
                else:
                    client.load_model(BASELINE, client_timeout=bench.remaining())
                spans[who] = (start, time.perf_counter())
                load.settle(answers=3, seconds=bench.settle, timeout=bench.remaining())
            swap = Swap(i, spans["daemon"], steps, spans["triton"], copy, operation)
            swaps.append(swap)
            print(
                f"run {run} swap {i}/{bench.swaps}: deploy {swap.deploy_s * 1e3:.0f} ms "
                f"(load step {steps.get('load', 0.0) * 1e3:.0f}, own steps "
                f"{swap.own_steps_s * 1e3:.0f}) | Triton load_model {swap.baseline_s * 1e3:.0f} ms",
                flush=True,
            )
    return swaps, load


# --- analysis ------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); nan when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def overlaps(request: Request, spans: Sequence[tuple[float, float]]) -> bool:
    return any(request.start <= end and request.end >= start for start, end in spans)


def summarize(swaps: list[Swap], load: TimedLoad) -> dict[str, float]:
    """One run's numbers: medians over its swaps, latency percentiles, counts."""
    release_of = {float(i + 1): i for i in range(len(swaps) + 1)}  # r_i answers k = i + 1
    out_of_order = stale = unexpected = 0
    for log in load.requests:
        highest = -1
        for request in log:
            if request.value is None:
                continue
            index = release_of.get(request.value)
            if index is None:
                unexpected += 1
                continue
            out_of_order += index < highest
            highest = max(highest, index)
            # Sent after the deploy of r_j returned, yet answered by an older release.
            stale += any(request.start > s.deploy[1] and index < s.release for s in swaps)
    everything = [r for log in load.requests for r in log]
    ok = [r for r in everything if r.value is not None]
    deploys = [s.deploy for s in swaps]
    baselines = [s.baseline for s in swaps]
    during = [(r.end - r.start) * 1e3 for r in ok if overlaps(r, deploys)]
    during_base = [(r.end - r.start) * 1e3 for r in ok if overlaps(r, baselines)]
    idle = [(r.end - r.start) * 1e3 for r in ok if not overlaps(r, deploys + baselines)]
    med = statistics.median
    return {
        "deploy_ms": med(s.deploy_s * 1e3 for s in swaps),
        "baseline_ms": med(s.baseline_s * 1e3 for s in swaps),
        "overhead_ms": med((s.deploy_s - s.baseline_s) * 1e3 for s in swaps),
        "own_steps_ms": med(s.own_steps_s * 1e3 for s in swaps),
        "fetch_ms": med(s.steps.get("fetch", 0.0) * 1e3 for s in swaps),
        "load_step_ms": med(s.steps.get("load", 0.0) * 1e3 for s in swaps),
        "beyond_copy_ms": med(
            (s.deploy_s - s.baseline_s - s.steps.get("fetch", 0.0)) * 1e3 for s in swaps
        ),
        "beside_load_ms": med((s.deploy_s - s.steps.get("load", 0.0)) * 1e3 for s in swaps),
        "beside_load_beyond_copy_ms": med(
            (s.deploy_s - s.steps.get("load", 0.0) - s.steps.get("fetch", 0.0)) * 1e3 for s in swaps
        ),
        "baseline_min_ms": min(s.baseline_s * 1e3 for s in swaps),  # not in the table: noise
        "baseline_max_ms": max(s.baseline_s * 1e3 for s in swaps),
        "operation_ms": med(s.operation_s * 1e3 for s in swaps),
        "outside_steps_ms": med(s.outside_steps_s * 1e3 for s in swaps),
        "ratio": med(s.deploy_s / s.baseline_s for s in swaps),
        "baseline_copy_ms": med(s.baseline_copy * 1e3 for s in swaps),
        "p50_deploy_ms": percentile(during, 0.5),
        "p99_deploy_ms": percentile(during, 0.99),
        "p50_baseline_ms": percentile(during_base, 0.5),
        "p99_baseline_ms": percentile(during_base, 0.99),
        "p50_idle_ms": percentile(idle, 0.5),
        "p99_idle_ms": percentile(idle, 0.99),
        "requests": len(everything),
        "failed": len(everything) - len(ok),
        "out_of_order": out_of_order,
        "stale": stale,
        "unexpected": unexpected,
    }


# --- main ----------------------------------------------------------------------------------


def cache_dir() -> Path:
    stable = Path.home() / ".cache" / "controlplane-tests"  # shared with tests/conftest.py
    with contextlib.suppress(OSError):
        stable.mkdir(parents=True, exist_ok=True)
        if os.access(stable, os.W_OK | os.X_OK):
            return stable
    return Path(tempfile.mkdtemp(prefix="triton-cache-"))


@contextlib.contextmanager
def started(root: Path, args: argparse.Namespace) -> Iterator[Bench]:
    """Triton and the daemon on `root`, stopped on the way out whatever happens."""
    for name in ("repository", "store", "scratch", "daemon"):
        (root / name).mkdir()
    for i in range(args.swaps + 1):
        write_scale_release(root / "store", MODEL, f"r{i}", k=float(i + 1))
    triton = launch_triton(root / "repository", cache_dir=cache_dir(), log_path=root / "triton.log")
    try:
        daemon = start_daemon(  # this bench measures inplace swaps; blue_green.py the other
            triton=triton,
            store=root / "store",
            workdir=root / "daemon",
            config="model_defaults:\n  strategy: inplace\n",
        )
        try:
            bench = Bench(
                triton=triton,
                daemon=daemon,
                store=root / "store",
                scratch=root / "scratch",
                swaps=args.swaps,
                clients=args.clients,
                settle=args.settle,
                deadline=time.perf_counter() + args.timeout,
            )
            try:
                yield bench
            finally:
                bench.control.close()
                bench.http.close()
        finally:
            daemon.stop()
    finally:
        triton.stop()  # after the daemon, so the daemon never sees Triton vanish mid-call


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--clients", type=int, default=4, help="client threads (default 4)")
    parser.add_argument("--swaps", type=int, default=10, help="swaps per run (default 10)")
    parser.add_argument("--runs", type=int, default=3, help="runs; medians are over runs")
    parser.add_argument("--settle", type=float, default=0.5, help="idle s after each reload")
    parser.add_argument("--timeout", type=float, default=900.0, help="give up after this many s")
    parser.add_argument("--write-readme", action="store_true", help="update bench/README.md")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 clients, 2 swaps")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.swaps, args.runs, args.settle = 2, 2, 1, 0.3
    if min(args.clients, args.swaps, args.runs) < 1:
        parser.error("--clients, --swaps and --runs must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="hot-swap-") as tmp, started(Path(tmp), args) as b:
        client = b.control
        place_baseline(b, "r0")
        client.load_model(BASELINE, client_timeout=b.remaining())
        summary = machine(b.triton)
        print(f"{summary}\n", flush=True)
        runs = []
        for run in range(1, args.runs + 1):
            swaps, load = run_once(b, run)
            runs.append(summarize(swaps, load))
            for error in sorted(set(load.errors))[:5]:
                print(f"  error: {error}", flush=True)
    print(f"\n{verdict(runs)}\n\n{table(runs)}")
    if args.write_readme:
        write_readme(section(args, summary, runs))
        print(f"\nwrote {README}")
    return 0


if __name__ == "__main__":
    run_main(main)
