"""Automatic rollback: from the first overloaded sample to the fallback serving, by both paths.

When GPU utilisation stays above 0.95 for a 10 s window, the daemon switches a model back to its
fallback release (the previous one: a blue-green re-point while that slot is still warm). The
signal reaches the daemon by one of two paths, and this bench times both in the same run:

* ``watcher``: the daemon scrapes a ``/metrics`` URL itself every second (``rollback.source:
  triton``) and its own evaluator decides;
* ``alert``: Prometheus scrapes the exporter every second, the rule
  ``avg_over_time(nv_gpu_utilization[10s]) > 0.95`` with ``for: 10s`` fires, and Alertmanager
  posts it to ``POST /v1/alerts`` with a bearer token (``rollback.source: none``).

Everything is real except the GPU: the bundled Triton (CPU), the daemon process, Prometheus and
Alertmanager (the Debian packages in /usr/bin). Utilisation comes from the tests' loopback
exporter, one per path so the paths never see each other's samples. Per run and path: a fresh
daemon and model whose r2 serves (x2) with r1 (x1) warm in the other slot; then the exporter
serves 0.99 and the clock starts at its first scrape that served it. It stops at the first
answer of r1 through the model's alias, from one client polling every 20 ms, while N load
clients send inference back to back and count failures. The daemon's own records split that
time: detection (to the rollback record's start), the record's duration and its operation's
``switch`` step; on the alert path also Prometheus's pending time and the webhook's arrival.

The reference points are what the rules say: 10 s (the window) for the watcher, 20 s (window +
``for``) for the alert path; total minus that is the reaction overhead. (As measured, the
watcher's evaluator acts 11 or 12 s after the onset and Prometheus 19 s plus its evaluation
phase; bench/README.md says why.)

Run from the repo root: ``.venv/bin/python bench/rollback.py [--quick] [--write-readme]``.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import numpy as np
import tritonclient.grpc as grpcclient

from bench.hot_swap import Request, TimedLoad, cache_dir
from bench.report import README, machine, run_main
from bench.rollback_report import PATHS, section, table, verdict, write_readme
from devtools.launcher import RunningTriton, launch_triton
from tests.support.daemon import Daemon, start_daemon
from tests.support.gpu_exporter import GpuExporter
from tests.support.models import write_scale_release
from tests.support.monitoring import Alertmanager, Prometheus, overload_rule

WINDOW = 10.0  # rollback.window_seconds, and the rule's range
FOR = 10.0  # the rule's `for:`
INTERVAL = 1.0  # the watcher's sampling and Prometheus's scrape and evaluation interval
THRESHOLD, HIGH, LOW = 0.95, 0.99, 0.30
FLOOR = {"watcher": WINDOW, "alert": WINDOW + FOR}  # the soonest each rule can fire
FALLBACK, OVERLOADED = 1.0, 2.0  # what r1 and r2 answer for INPUT0 = 1
RETIRE_AFTER = 3600.0  # r1's slot stays warm for the whole run: the rollback is a re-point


def perf_of(stamp: str | float) -> float:
    """A wall-clock time (ISO from the daemon, Unix from Prometheus) on perf_counter()'s scale.

    Both processes run on this host, so their wall clock is this one's.
    """
    wall = datetime.fromisoformat(stamp).timestamp() if isinstance(stamp, str) else stamp
    return wall - (time.time() - time.perf_counter())


def wait_until(check: Callable[[], bool], timeout: float, what: str, every: float) -> float:
    """Poll ``check`` every ``every`` s; the perf_counter() at which it first held."""
    deadline = time.perf_counter() + timeout
    while not check():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:g} s")
        time.sleep(every)
    return time.perf_counter()


@dataclass
class Bench:
    triton: RunningTriton
    root: Path
    args: argparse.Namespace
    deadline: float

    def remaining(self) -> float:
        left = self.deadline - time.perf_counter()
        if left <= 0:
            raise TimeoutError("the bench ran past its --timeout")
        return left


# --- the measured moments ------------------------------------------------------------------


@dataclass(frozen=True)
class Onset:
    set_at: float  # exporter.set(0.99) called
    first_scrape_at: float  # its first scrape after that seen (0.5 ms polling)
    raced: bool  # a scrape came between reading the count and set(): timed from set() instead


def overload(exporter: GpuExporter) -> Onset:
    """Serve HIGH from a random point between two scrapes; when the first scrape served it.

    Scrapes come every INTERVAL, so setting between 0.2 and 0.8 of one after a scrape leaves no
    doubt which scrape was the first to serve HIGH: the next one.
    """
    seen = exporter.scrapes
    wait_until(lambda: exporter.scrapes > seen, 10 * INTERVAL, "a scrape", every=0.0005)
    time.sleep(random.uniform(0.2, 0.8) * INTERVAL)
    before = exporter.scrapes
    set_at = time.perf_counter()
    exporter.set(gpu0=HIGH)
    raced = exporter.scrapes != before
    first = wait_until(lambda: exporter.scrapes > before, 10 * INTERVAL, "a scrape", 0.0005)
    return Onset(set_at, set_at if raced else first, raced)


def poll_until_fallback(url: str, model: str, every: float, timeout: float) -> list[Request]:
    """One client asking the alias every ``every`` s until r1 answers; all its requests."""
    client = grpcclient.InferenceServerClient(url)
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    polls: list[Request] = []
    beat = time.perf_counter()
    deadline = beat + timeout
    try:
        while True:
            start = time.perf_counter()
            value: float | None = None
            with contextlib.suppress(Exception):  # a failed poll is counted, not raised
                value = float(
                    client.infer(model, [tensor], client_timeout=10.0).as_numpy("OUTPUT0")[0]
                )
            polls.append(Request(start, time.perf_counter(), value))
            if value == FALLBACK:
                return polls
            if time.perf_counter() > deadline:
                raise TimeoutError(f"r1 of {model} not serving {timeout:g} s after the onset")
            beat += every
            time.sleep(max(0.0, beat - time.perf_counter()))
    finally:
        client.close()


# --- one path, one run ---------------------------------------------------------------------


def daemon_config(path: str, model: str, metrics_url: str) -> str:
    if path == "watcher":
        rollback = (
            f"  source: triton\n  metrics_url: {metrics_url}\n  threshold: {THRESHOLD}\n"
            f"  window_seconds: {WINDOW}\n  interval_seconds: {INTERVAL}\n"
        )
    else:
        rollback = "  source: none\n"
    return (
        f"rollback:\n{rollback}models:\n  {model}:\n"
        f"    retire_after_seconds: {RETIRE_AFTER}\n    drain_timeout_seconds: 5\n"
    )


def model_of(daemon: Daemon, model: str) -> dict[str, Any]:
    response = daemon.get(f"/v1/models/{model}")
    response.raise_for_status()
    found: dict[str, Any] = response.json()
    return found


def unload(daemon: Daemon, model: str) -> None:
    """Leave Triton as the run found it; a failure here is reported, not raised."""
    try:
        response = daemon.post(f"/v1/models/{model}/unload", {"wait": True})
        if response.status_code != 200:
            print(f"  unload of {model}: {response.status_code} {response.text[:200]}")
    except httpx.HTTPError as exc:
        print(f"  unload of {model}: {exc!r}")


@contextlib.contextmanager
def serving(
    bench: Bench, path: str, model: str
) -> Iterator[tuple[Daemon, GpuExporter, Prometheus | None]]:
    """A fresh daemon (and for ``alert`` Prometheus + Alertmanager), r2 serving, r1 warm."""
    root = bench.root / model
    for release, k in (("r1", FALLBACK), ("r2", OVERLOADED)):
        write_scale_release(bench.root / "store", model, release, k=k)
    token = secrets.token_urlsafe(24) if path == "alert" else None
    with contextlib.ExitStack() as stack:
        exporter = stack.enter_context(GpuExporter())
        exporter.set(gpu0=LOW)
        (root / "daemon").mkdir(parents=True)
        daemon = start_daemon(
            triton=bench.triton,
            store=bench.root / "store",
            workdir=root / "daemon",
            token=token,
            config=daemon_config(path, model, exporter.url),
        )
        stack.callback(daemon.stop)
        stack.callback(unload, daemon, model)  # before the daemon stops, after the monitors
        prometheus: Prometheus | None = None
        if token is not None:  # started before the deploys: Prometheus takes ~5 s to scrape
            alertmanager = stack.enter_context(
                Alertmanager(
                    root / "alertmanager",
                    webhook_url=f"{daemon.url}/v1/alerts",
                    bearer_token=token,
                )
            )
            rules = overload_rule(THRESHOLD, f"{WINDOW:g}s", f"{FOR:g}s", labels={"model": model})
            prometheus = stack.enter_context(
                Prometheus(
                    root / "prometheus",
                    scrape_url=exporter.url,
                    alertmanager_url=alertmanager.url,
                    rules=rules,
                    scrape_interval=f"{INTERVAL:g}s",
                    evaluation_interval=f"{INTERVAL:g}s",
                )
            )
        for release in ("r1", "r2"):
            response = daemon.deploy(model, release)
            if response.status_code != 200:
                raise RuntimeError(
                    f"deploy {model} {release}: {response.status_code} {response.text}"
                )
        if prometheus is not None:
            prometheus.wait_for_scrape()
        else:
            wait_until(
                lambda: (model_of(daemon, model)["overload"] or {}).get("verdict") == "healthy",
                30,
                "a healthy verdict",
                every=0.1,
            )
        yield daemon, exporter, prometheus


def rollback_record(daemon: Daemon, model: str, path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The daemon's rollback record of ``model`` and its fallback operation, once saved."""
    wait_until(
        lambda: (model_of(daemon, model)["rollback"]["last"] or {}).get("outcome") is not None,
        30,
        "the rollback record",
        every=0.05,
    )
    last: dict[str, Any] = model_of(daemon, model)["rollback"]["last"]
    expected = ("watcher" if path == "watcher" else "alert", "fallback", "r2", "r1")
    got = (last["trigger"], last["outcome"], last["from_release"], last["to_release"])
    if got != expected:
        raise RuntimeError(f"{model}: rollback {got}, expected {expected}: {last}")
    response = daemon.get(f"/v1/operations/{last['operations'][0]}")
    response.raise_for_status()
    operation: dict[str, Any] = response.json()["operation"]
    return last, operation


def alert_moments(daemon: Daemon, prometheus: Prometheus, model: str) -> dict[str, float]:
    """Prometheus's first high sample, when its alert went pending, the firing time it sent,
    and when the daemon got that."""
    # Its /api/v1/alerts, not ALERTS_FOR_STATE, whose value is activeAt cut to whole seconds.
    pending = [
        a for a in prom_api(prometheus, "alerts")["alerts"] if a["labels"].get("model") == model
    ]
    # The raw samples: Prometheus's own timestamp of its first sample above the threshold.
    [series] = prom_api(prometheus, "query", query="nv_gpu_utilization[2m]")["result"]
    high = [float(at) for at, value in series["values"] if float(value) > THRESHOLD]
    alerts = daemon.get("/v1/alerts").json()["alerts"]
    stored = [a for a in alerts if a["labels"].get("model") == model]
    if not pending or not stored:
        raise RuntimeError(f"{model}: alert missing (Prometheus {pending}, daemon {stored})")
    return {
        "pending_at": min(perf_of(a["activeAt"]) for a in pending),
        "starts_at": min(perf_of(a["starts_at"]) for a in stored),
        "received_at": min(perf_of(a["first_received"]) for a in stored),
        "sampled_at": perf_of(min(high)),
    }


def prom_api(prometheus: Prometheus, endpoint: str, **params: str) -> dict[str, Any]:
    """The ``data`` of Prometheus's ``/api/v1/<endpoint>``."""
    answer = httpx.get(
        f"{prometheus.url}/api/v1/{endpoint}", params=params, timeout=5.0, trust_env=False
    )
    answer.raise_for_status()
    data: dict[str, Any] = answer.json()["data"]
    return data


def measure(bench: Bench, run: int, path: str) -> dict[str, float]:
    """One path, one run: the onset, the poller's wait for r1, and what the daemon recorded."""
    model = f"rb-{'watch' if path == 'watcher' else 'alert'}-{run}"
    args, url = bench.args, bench.triton.grpc_url
    with serving(bench, path, model) as (daemon, exporter, prometheus):
        with TimedLoad(url, model, args.clients, bench.remaining()) as load:
            load.settle(answers=5, seconds=0.5, timeout=bench.remaining())
            onset = overload(exporter)
            polls = poll_until_fallback(url, model, args.poll, FLOOR[path] + 40)
            load.settle(answers=5, seconds=0.5, timeout=bench.remaining())
        last, operation = rollback_record(daemon, model, path)
        moments = alert_moments(daemon, prometheus, model) if prometheus is not None else {}
    for error in sorted(set(load.errors))[:5]:
        print(f"  error: {error}", flush=True)
    return numbers(path, onset, polls, load, last, operation, moments)


def numbers(
    path: str,
    onset: Onset,
    polls: list[Request],
    load: TimedLoad,
    last: dict[str, Any],
    operation: dict[str, Any],
    moments: dict[str, float],
) -> dict[str, float]:
    """One path's values for one run, keyed ``<path>_<name>``: times from the onset, counts."""
    first, seen = onset.first_scrape_at, polls[-1].end
    started = perf_of(last["at"])
    switch = next(step for step in operation["steps"] if step["name"] == "switch")
    out = {
        "total_s": seen - first,
        "overhead_s": seen - first - FLOOR[path],
        "detect_s": started - first,
        "record_ms": float(last["detail"]["seconds"]) * 1e3,
        "operation_ms": float(operation["duration_seconds"] or 0.0) * 1e3,
        "switch_ms": float(switch["duration_seconds"] or 0.0) * 1e3,
        "repoint_ms": float(switch["detail"].get("repoint_ms", float("nan"))),
        "seen_ms": (seen - perf_of(switch["finished_at"])) * 1e3,
        "set_to_scrape_ms": (first - onset.set_at) * 1e3,
    }
    if moments:
        out["sampled_ms"] = (moments["sampled_at"] - first) * 1e3
        out["pending_s"] = moments["pending_at"] - first
        out["firing_s"] = moments["starts_at"] - moments["pending_at"]
        out["delivery_ms"] = (moments["received_at"] - moments["starts_at"]) * 1e3
        out["act_ms"] = (started - moments["received_at"]) * 1e3
    back = unexpected = 0
    for log in [*load.requests, polls]:
        fell_back = False
        for request in log:
            if request.value not in (None, FALLBACK, OVERLOADED):
                unexpected += 1
            back += fell_back and request.value == OVERLOADED
            fell_back = fell_back or request.value == FALLBACK
    everything = [r for log in load.requests for r in log]
    out |= {
        "requests": len(everything),
        "failed": sum(r.value is None for r in everything),
        "polls": len(polls),
        "poll_failed": sum(r.value is None for r in polls),
        "back": back,
        "unexpected": unexpected,
        "raced": onset.raced,
    }
    return {f"{path}_{key}": float(value) for key, value in out.items()}


# --- main ----------------------------------------------------------------------------------


@contextlib.contextmanager
def started(root: Path, args: argparse.Namespace) -> Iterator[Bench]:
    """One Triton on `root` for every run and path, stopped on the way out whatever happens."""
    for name in ("repository", "store"):
        (root / name).mkdir()
    triton = launch_triton(root / "repository", cache_dir=cache_dir(), log_path=root / "triton.log")
    try:
        yield Bench(triton, root, args, time.perf_counter() + args.timeout)
    finally:
        triton.stop()  # each path's daemon has stopped by now


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3, help="runs; medians are over runs")
    parser.add_argument("--clients", type=int, default=2, help="load client threads (default 2)")
    parser.add_argument(
        "--poll", type=float, default=0.02, help="s between the poller's requests (default 0.02)"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="give up after this many s")
    parser.add_argument("--write-readme", action="store_true", help="update bench/README.md")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 run (~1 min)")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs = 1
    if min(args.runs, args.clients) < 1 or args.poll <= 0:
        parser.error("--runs and --clients must be at least 1, --poll above 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="rollback-") as tmp, started(Path(tmp), args) as b:
        summary = machine(b.triton)
        print(f"{summary}\n", flush=True)
        runs = []
        for run in range(1, args.runs + 1):
            result: dict[str, float] = {}
            for path in PATHS if run % 2 else PATHS[::-1]:  # neither always goes first
                result |= measure(b, run, path)
                print(
                    f"run {run} {path}: fallback serving {result[f'{path}_total_s']:.2f} s after "
                    f"the first 0.99 scrape (detected at {result[f'{path}_detect_s']:.2f} s, "
                    f"rollback {result[f'{path}_record_ms']:.0f} ms, switch "
                    f"{result[f'{path}_switch_ms']:.0f} ms), {result[f'{path}_failed']:.0f} of "
                    f"{result[f'{path}_requests']:.0f} requests failed",
                    flush=True,
                )
            result["ratio"] = result["alert_total_s"] / result["watcher_total_s"]
            runs.append(result)
    print(f"\n{verdict(runs)}\n\n{table(runs)}")
    if args.write_readme:
        write_readme(section(args, summary, runs))
        print(f"\nwrote {README}")
    return 0


if __name__ == "__main__":
    run_main(main)
