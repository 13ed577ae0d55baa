"""Blue-green under load: what a switch costs, and what the alias costs every request.

Under the ``blue-green`` strategy clients call ``<model>``, a one-step Triton ensemble that
forwards to ``<model>__blue`` or ``<model>__green``; a switch re-points that alias with
``load_model(<model>, config=<json>)``. The strategy promises that moving traffic is a matter of
milliseconds, that no request fails and no answer goes back across a switch, and that the alias
costs little on every request. This bench measures those against the real bundled Triton
(EXPLICIT mode, CPU) and the real daemon process, in one run:

* K deploys through the daemon (``deploy r_i, wait=True``) while N client threads send gRPC
  inference to the alias back to back: the deploy's wall time, its steps, and the ``switch``
  step with its ``repoint_ms`` detail (the alias's ``load_model`` alone), median and p99.
* K rollbacks inside the retire window (``POST /v1/models/<m>/rollback``), which the daemon
  does as a pure re-point to the warm old slot: the same timings, under the same load.
* Every request's start, end and answer: failed requests, answers that go back to an older
  release, answers from a release that was not serving while the request ran.
* With no switch running and no other load, the alias against the active slot called directly,
  in alternating batches from one client and then from N: p50, p99 and the ratios
  alias / direct, the baseline measured in the same run under the same load.

The model's retire window (``--retire-after``, default 3600 s) is longer than a run: no retire
(drain, unload) then runs beside a measured switch or competes for the model's lock, and every
rollback is sure to land inside the window. Each deploy pays for that: its ``free`` step unloads
the release the other slot still held.

Machines are noisy, so the reported numbers are medians over runs of per-run values, with the
spread across runs. Counts of bad requests are totals over all runs: their target is 0.

Run from the repo root: ``.venv/bin/python bench/blue_green.py [--quick] [--write-readme]``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import numpy as np
import tritonclient.grpc as grpcclient

from bench.blue_green_report import SLOW_REPOINT_MS, section, table, verdict, write_readme
from bench.hot_swap import Request, TimedLoad, cache_dir, overlaps, percentile
from bench.report import README, machine, run_main
from devtools.launcher import RunningTriton, launch_triton
from tests.support.daemon import Daemon, start_daemon
from tests.support.models import write_scale_release

MODEL = "bluegreen"
RETIRE_AFTER = 3600.0  # longer than any run: no retire beside a measured switch


def value_of(release: str) -> float:
    """What release r_i answers for INPUT0 = 1: k = i + 1."""
    return float(int(release.removeprefix("r")) + 1)


# --- switches ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Switch:
    kind: str  # "deploy" or "rollback"
    release: str  # the release serving once it returned
    span: tuple[float, float]  # time.perf_counter() around the HTTP call
    steps: dict[str, float]  # step name -> seconds, as the daemon records them
    repoint_ms: float

    @property
    def wall_s(self) -> float:
        return self.span[1] - self.span[0]


@dataclass
class Bench:
    """Everything one bench process set up, and the knobs of its runs."""

    triton: RunningTriton
    daemon: Daemon
    args: argparse.Namespace
    deadline: float
    http: httpx.Client = field(init=False)  # kept alive: a new client costs tens of ms

    def __post_init__(self) -> None:
        self.http = self.daemon.client()

    def remaining(self) -> float:
        left = self.deadline - time.perf_counter()
        if left <= 0:
            raise TimeoutError("the bench ran past its --timeout")
        return left


def operate(bench: Bench, kind: str, body: dict[str, Any]) -> Switch:
    """One deploy or rollback through the daemon, waited for; its timings."""
    start = time.perf_counter()
    response = bench.http.post(f"/v1/models/{MODEL}/{kind}", json={**body, "wait": True})
    end = time.perf_counter()
    if response.status_code != 200:
        raise RuntimeError(f"{kind} {body} failed: {response.status_code} {response.text}")
    operation = response.json()["operation"]
    steps = {str(s["name"]): float(s["duration_seconds"] or 0.0) for s in operation["steps"]}
    switch = next(s for s in operation["steps"] if s["name"] == "switch")
    repoint = float(switch["detail"]["repoint_ms"])
    return Switch(kind, str(operation["release"]), (start, end), steps, repoint)


def switch_under_load(bench: Bench, run: int) -> tuple[list[Switch], TimedLoad]:
    args = bench.args
    operate(bench, "deploy", {"release": "r0"})  # every run starts from r0; not measured
    switches: list[Switch] = []
    url = bench.triton.grpc_url
    with TimedLoad(url, MODEL, args.clients, bench.remaining()) as load:
        load.settle(answers=5, seconds=args.settle, timeout=bench.remaining())
        plan = [("deploy", {"release": f"r{i}"}) for i in range(1, args.switches + 1)]
        plan += [("rollback", {})] * args.switches
        for n, (kind, body) in enumerate(plan, start=1):
            switch = operate(bench, kind, body)
            switches.append(switch)
            steps = ", ".join(f"{k} {v * 1e3:.0f}" for k, v in switch.steps.items())
            print(
                f"run {run} {n}/{len(plan)} {kind} -> {switch.release}: wall "
                f"{switch.wall_s * 1e3:.0f} ms, repoint {switch.repoint_ms:.1f} ms ({steps})",
                flush=True,
            )
            load.settle(answers=3, seconds=args.settle, timeout=bench.remaining())
    return switches, load


# --- alias overhead ------------------------------------------------------------------------


@dataclass
class Overhead:
    """Latencies (ms) to the alias and to the active slot directly, from alternating batches."""

    alias: list[float] = field(default_factory=list)
    direct: list[float] = field(default_factory=list)
    failed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def alternate(url: str, slot: str, clients: int, args: argparse.Namespace) -> Overhead:
    """`clients` threads, each alternating batches alias / slot (half of them slot first)."""
    result = Overhead()
    control = grpcclient.InferenceServerClient(url)
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    expected = float(control.infer(slot, [tensor]).as_numpy("OUTPUT0")[0])
    control.close()

    def client_loop(index: int) -> None:
        client = grpcclient.InferenceServerClient(url)
        tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        own: dict[str, list[float]] = {MODEL: [], slot: []}
        failed = 0
        try:
            for name in (MODEL, slot):  # warm both paths (channel, Triton's first-call costs)
                for _ in range(10):
                    client.infer(name, [tensor], client_timeout=30.0)
            for batch in range(args.batches):
                order = (MODEL, slot) if (batch + index) % 2 == 0 else (slot, MODEL)
                for name in order:
                    for _ in range(args.batch):
                        start = time.perf_counter()
                        try:
                            output = client.infer(name, [tensor], client_timeout=30.0)
                            value = float(output.as_numpy("OUTPUT0")[0])
                        except Exception:  # every failure is what the bench counts
                            failed += 1
                            continue
                        own[name].append((time.perf_counter() - start) * 1e3)
                        failed += value != expected
        finally:
            client.close()
            with result.lock:
                result.alias += own[MODEL]
                result.direct += own[slot]
                result.failed += failed

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return result


def alias_overhead(bench: Bench) -> dict[str, float]:
    target = bench.http.get(f"/v1/models/{MODEL}").json()["alias_target"]
    url = bench.triton.grpc_url
    out: dict[str, float] = {"overhead_requests": 0, "overhead_failed": 0}
    for prefix, clients in (("one", 1), ("many", bench.args.clients)):
        measured = alternate(url, str(target), clients, bench.args)
        for q, tag in ((0.5, "p50"), (0.99, "p99")):
            alias, direct = percentile(measured.alias, q), percentile(measured.direct, q)
            out[f"{prefix}_alias_{tag}_ms"] = alias
            out[f"{prefix}_direct_{tag}_ms"] = direct
            out[f"{prefix}_ratio_{tag}"] = alias / direct
        out["overhead_requests"] += len(measured.alias) + len(measured.direct) + measured.failed
        out["overhead_failed"] += measured.failed
        print(
            f"  {clients} client(s) vs {target}: p50 alias "
            f"{out[f'{prefix}_alias_p50_ms']:.3f} / direct {out[f'{prefix}_direct_p50_ms']:.3f} "
            f"ms, p99 {out[f'{prefix}_alias_p99_ms']:.3f} / {out[f'{prefix}_direct_p99_ms']:.3f}",
            flush=True,
        )
    return out


# --- analysis ------------------------------------------------------------------------------


def order_counts(switches: Sequence[Switch], load: TimedLoad) -> dict[str, float]:
    """Answers that go back, or come from a release not serving while the request ran.

    State 0 is r0, state j what switch j put in place. State j may answer from the start of
    switch j's call to the end of switch j+1's. Rollbacks alternate between two releases, so
    an answer is matched to the states it may come from, not to its value alone.
    """
    values = [value_of("r0")] + [value_of(s.release) for s in switches]
    known = set(values)
    starts = [float("-inf")] + [s.span[0] for s in switches]
    ends = [s.span[1] for s in switches] + [float("inf")]
    out_of_order = stale = unexpected = 0
    for log in load.requests:
        floor = 0  # the latest state this client has certainly seen
        for request in log:
            if request.value is None:
                continue
            if request.value not in known:
                unexpected += 1
                continue
            states = [
                j
                for j, v in enumerate(values)
                if v == request.value and request.start <= ends[j] and request.end >= starts[j]
            ]
            if not states:
                stale += 1
                continue
            out_of_order += max(states) < floor
            floor = max(floor, min(states))
    return {"out_of_order": out_of_order, "stale": stale, "unexpected": unexpected}


def summarize(
    switches: list[Switch], load: TimedLoad, overhead: dict[str, float]
) -> dict[str, float]:
    """One run's numbers: medians and p99 over its switches, latencies, counts."""
    out: dict[str, float] = {}
    for kind in ("deploy", "rollback"):
        mine = [s for s in switches if s.kind == kind]
        for key, values in (
            ("wall", [s.wall_s * 1e3 for s in mine]),
            ("switch", [s.steps["switch"] * 1e3 for s in mine]),
            ("repoint", [s.repoint_ms for s in mine]),
        ):
            out[f"{kind}_{key}_ms"] = statistics.median(values)
            out[f"{kind}_{key}_p99_ms"] = percentile(values, 0.99)
    deploys = [s for s in switches if s.kind == "deploy"]
    for step in ("free", "load", "preflight"):
        out[f"deploy_{step}_ms"] = statistics.median(s.steps.get(step, 0.0) * 1e3 for s in deploys)
    everything = [r for log in load.requests for r in log]
    ok = [r for r in everything if r.value is not None]

    def latencies(keep: list[Request], spans: list[tuple[float, float]]) -> list[float]:
        return [(r.end - r.start) * 1e3 for r in keep if overlaps(r, spans)]

    spans = {kind: [s.span for s in switches if s.kind == kind] for kind in ("deploy", "rollback")}
    idle = [(r.end - r.start) * 1e3 for r in ok if not overlaps(r, [s.span for s in switches])]
    for name, values in (
        ("idle", idle),
        ("deploy", latencies(ok, spans["deploy"])),
        ("rollback", latencies(ok, spans["rollback"])),
    ):
        out[f"p50_{name}_ms"] = percentile(values, 0.5)
        out[f"p99_{name}_ms"] = percentile(values, 0.99)
    out.update(order_counts(switches, load))
    out["requests"] = len(everything)
    out["failed"] = len(everything) - len(ok)
    out["repoints"] = len(switches)
    out["slow_repoints"] = sum(s.repoint_ms > SLOW_REPOINT_MS for s in switches)
    out["repoint_max_ms"] = max(s.repoint_ms for s in switches)
    out.update(overhead)
    return out


# --- main ----------------------------------------------------------------------------------


def daemon_config(args: argparse.Namespace) -> str:
    return (
        f"models:\n  {MODEL}:\n    strategy: blue-green\n"
        f"    retire_after_seconds: {args.retire_after}\n    drain_timeout_seconds: 5\n"
    )


@contextlib.contextmanager
def started(root: Path, args: argparse.Namespace) -> Iterator[Bench]:
    """Triton and the daemon on `root`, stopped on the way out whatever happens."""
    for name in ("repository", "store", "daemon"):
        (root / name).mkdir()
    for i in range(args.switches + 1):
        write_scale_release(root / "store", MODEL, f"r{i}", k=value_of(f"r{i}"))
    triton = launch_triton(root / "repository", cache_dir=cache_dir(), log_path=root / "triton.log")
    try:
        daemon = start_daemon(
            triton=triton,
            store=root / "store",
            workdir=root / "daemon",
            config=daemon_config(args),
        )
        try:
            bench = Bench(triton, daemon, args, time.perf_counter() + args.timeout)
            try:
                yield bench
            finally:
                bench.http.close()
        finally:
            daemon.stop()
    finally:
        triton.stop()  # after the daemon, so the daemon never sees Triton vanish mid-call


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--clients", type=int, default=4, help="client threads (default 4)")
    parser.add_argument(
        "--switches", type=int, default=10, help="deploys, and rollbacks, per run (default 10)"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs; medians are over runs")
    parser.add_argument("--settle", type=float, default=0.5, help="idle s after each switch")
    parser.add_argument(
        "--batch", type=int, default=100, help="requests per batch, alias overhead (default 100)"
    )
    parser.add_argument(
        "--batches",
        type=int,
        default=20,
        help="batch pairs per client, alias overhead (default 20)",
    )
    parser.add_argument(
        "--retire-after", type=float, default=RETIRE_AFTER, help="the model's retire window (s)"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="give up after this many s")
    parser.add_argument("--write-readme", action="store_true", help="update bench/README.md")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 2 clients, 2 switches, 1 run"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.switches, args.runs, args.settle = 2, 2, 1, 0.3
        args.batch, args.batches = 50, 4
    if min(args.clients, args.switches, args.runs, args.batch, args.batches) < 1:
        parser.error("--clients, --switches, --runs, --batch and --batches must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="blue-green-") as tmp, started(Path(tmp), args) as b:
        summary = machine(b.triton)
        print(f"{summary}\n", flush=True)
        runs = []
        for run in range(1, args.runs + 1):
            switches, load = switch_under_load(b, run)
            for error in sorted(set(load.errors))[:5]:
                print(f"  error: {error}", flush=True)
            runs.append(summarize(switches, load, alias_overhead(b)))
    print(f"\n{verdict(runs, args.clients)}\n\n{table(runs)}")
    if args.write_readme:
        write_readme(section(args, summary, runs))
        print(f"\nwrote {README}")
    return 0


if __name__ == "__main__":
    run_main(main)
