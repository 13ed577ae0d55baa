"""Fleet scale: what N members ask of an S3 store while idle, and how soon all hear a change.

A simulation of the store side of a fleet, said as such: :mod:`bench.fleet_sim`'s members are
the daemon's real store adapters with a small loop at the daemon's cadences, each member's
Triton replaced by a recorder that serves whatever it is told. moto's server (S3, SNS and
SQS over HTTP, in a process of its own) is the store, with counting proxies in front of it
(:mod:`bench.store_counter`). No daemon process and no Triton run; members share processes
(up to ``--per-worker`` each).

For each fleet (N members, M models, the fan-out on or off):

* Idle: every member's requests in a window of ``--window`` s (the default, 300 s, is a full
  scan's period: each periodic action falls in it exactly once per member and period, since
  the phases are spread evenly over the fleet), per member per minute, by kind. The fleet's
  upkeep (``forget_departed``: a listing of the heartbeats and a GET of each one that changed)
  costs a GET per member of the fleet, so it runs on a sample of members (at most
  ``--upkeep-gets`` GETs in all), each once inside the window, and is counted per run.
* CPU seconds per minute in that window (``/proc``, through psutil) of moto (against its own
  floor with no member, measured before the members start), the proxies and the members'
  processes; and moto's answer time to a GET of the bench's own (:class:`Probe`), straight and
  through the proxy, while the fleet starts, idles and hears changes.
* Propagation: ``--changes`` changes of the desired state, each a ``swap()`` through one member
  (another model each time); for every other member the time from the swap's start to its
  ``read_all()`` returning the new generation (and, with the fan-out, to its queue saying so),
  and the cores each process kept busy meanwhile.

Fleets whose load is light run side by side (each with its own moto, proxies and workers, so
counts and CPU stay apart); a fleet of 1,000 runs alone. A fleet whose members do not start
within ``--start-timeout`` s is reported as such and stopped; the others go on. Propagation is
measured one fleet at a time, the others paused. Run from the repo root:
``.venv/bin/python bench/fleet_scale.py [--quick] [--write-readme]``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing
import os
import random
import shlex
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from bench.fleet_scale_report import Change, Config, FleetResult, percentile, section, write_readme
from bench.fleet_sim import Cadences, MemberSpec, WorkerSpec, worker_main
from bench.fleet_store import PREFIX
from bench.report import README, host, run_main
from bench.s3_download import MotoProcess, moto_server_process
from bench.store_counter import PROBE_KEY, counting_proxies
from controlplane.adapters.stores.s3 import S3Store
from controlplane.adapters.stores.s3_fleet import S3DesiredStates
from controlplane.adapters.stores.sqs_events import WAIT_SECONDS
from controlplane.domain.fleet import first_generation
from tests.support.s3 import notify_topic, s3_client, sns_client, upload_release

BUCKET = "fleet-scale"
# Fleets as members x models. Polling 1,000 is left out: 1,000 members listing the store and
# reading the index every 10 s is over 200 requests a second, several times what moto's server
# answers on this host beside the members (about 50 a second per CPU). So is 1,000 x 20 with
# the fan-out, for time (a fleet of 1,000 takes half an hour here): an idle member's requests
# do not depend on the models (a full scan is one listing), as 10 and 100 members show.
FLEETS = "10x1,10x20,100x1,100x20,1000x1"
POLLING = "10x1,10x20,100x1,100x20"
QUICK = ("10x1,10x20,100x1", "10x1")
RELEASES = 3  # r0 serves; changes go to r1 and r2
FILES = {"config.pbtxt": b'backend: "python"\n', "1/model.py": b"# a release\n"}


# --- one fleet -------------------------------------------------------------------------------


class Probe:
    """How long moto takes to answer while a fleet runs: every ``every`` s a GET of a small
    object of the bench's own, straight to moto and through the fleet's counting proxy (which
    counts it apart), each sample kept under the phase it fell in ("idle", "spread"). Not
    through the members' processes: what it shows is moto's (and the proxy's) answer time."""

    def __init__(self, moto: str, proxy: str, every: float = 2.0) -> None:
        self.clients = {
            "moto": s3_client(moto, read_timeout=120),
            "proxy": s3_client(proxy, read_timeout=120),
        }
        self.every = every
        self.phase: str | None = None  # None: not sampling
        self.samples: dict[tuple[str, str], list[float]] = {}
        self._stop = threading.Event()
        self.clients["moto"].put_object(Bucket=BUCKET, Key=PROBE_KEY, Body=b"probe\n")
        self._thread = threading.Thread(target=self._run, name="moto-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            phase = self.phase
            if phase is None:
                continue
            for way, client in self.clients.items():
                began = time.perf_counter()
                try:
                    client.get_object(Bucket=BUCKET, Key=PROBE_KEY)["Body"].read()
                except Exception:  # a timeout or a refusal: counted as the longest wait
                    self.samples.setdefault((phase, way), []).append(math.inf)
                    continue
                self.samples.setdefault((phase, way), []).append(time.perf_counter() - began)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=150)
        for client in self.clients.values():
            client.close()


def cpu_seconds(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


class SimFleet:
    """One fleet: moto, its counting proxies, the store's contents, the member processes."""

    def __init__(self, config: Config, root: Path, args: argparse.Namespace) -> None:
        self.config = config
        self.root = root
        self.args = args
        self.models = [f"m{j:02d}" for j in range(config.models)]
        self.result = FleetResult(config)
        self.workers: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> SimFleet:
        self.root.mkdir(parents=True)
        try:
            self.moto: MotoProcess = self._stack.enter_context(
                moto_server_process(self.root / "moto.log", backlog=4096)
            )
            self.counters = self._stack.enter_context(counting_proxies(self.moto.endpoint))
            self._stack.callback(self._stop_workers)
            self.topic = self._fill_store()
            self.probe = Probe(self.moto.endpoint, self.counters.endpoints["fleet"])
            self._stack.callback(self.probe.close)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _fill_store(self) -> str | None:
        """The releases, each model's desired record (r0) and, with the fan-out, the topic."""
        client = s3_client(self.moto.endpoint)
        try:
            client.create_bucket(Bucket=BUCKET)
            for model in self.models:
                for release in range(RELEASES):
                    upload_release(client, BUCKET, PREFIX, model, f"r{release}", FILES)
            records = S3DesiredStates(S3Store(f"s3://{BUCKET}/{PREFIX}", client=client))
            for model in self.models:
                now = datetime.now(UTC)
                seed = first_generation(model, by="bench", at=now, trigger="api", reason="seed")
                records.swap(
                    seed.changed(by="bench", at=now, trigger="api", reason="seed", release="r0")
                )
            if not self.config.fanout:
                return None
            sns = sns_client(self.moto.endpoint)
            try:
                return notify_topic(client, sns, BUCKET, PREFIX, f"{BUCKET}-events")
            finally:
                sns.close()
        finally:
            client.close()

    def specs(self, rng: random.Random) -> list[WorkerSpec]:
        """The members, their phases spread evenly over each period, split into workers."""
        n = self.config.members
        cadences: Cadences = self.args.cadences
        periods = cadences.periods(self.config.fanout)
        phases: dict[str, list[float]] = {}
        for action, period in periods.items():
            order, shift = rng.sample(range(n), n), rng.random()
            phases[action] = [(order[i] + shift) / n * period for i in range(n)]
        sample = min(n, max(1, self.args.upkeep_gets // n))
        upkeep = rng.sample(range(n), sample)
        # The sample's upkeep falls inside the idle window (its last tenth left for the last
        # run's requests): its cost is counted per run, and a run is due every period.
        span = 0.9 * min(self.args.window, periods["upkeep"])
        for rank, i in enumerate(upkeep):
            phases["upkeep"][i] = (rank + rng.random()) / sample * span
        self.result.upkeep_members = sample
        members = [
            MemberSpec(f"m{i:04d}", {a: phases[a][i] for a in periods}, i in set(upkeep))
            for i in range(n)
        ]
        per = self.args.per_worker
        return [
            WorkerSpec(
                endpoint=self.counters.endpoints["fleet"],
                upkeep_endpoint=self.counters.endpoints["upkeep"],
                uri=f"s3://{BUCKET}/{PREFIX}",
                topic_arn=self.topic,
                members=members[start : start + per],
                cadences=cadences,
                start_timeout=self.args.start_timeout,
            )
            for start in range(0, n, per)
        ]

    def start(self, rng: random.Random) -> None:
        context = multiprocessing.get_context("spawn")
        for spec in self.specs(rng):
            mine, theirs = context.Pipe()
            process = context.Process(target=worker_main, args=(spec, theirs), daemon=True)
            process.start()
            self.workers.append((process, mine))

    def ready(self, timeout: float) -> bool:
        """Whether the fleet started: all but 1 % of its members within the workers' start
        timeout. One that did not is stopped, and the result says why."""
        answers = [self._answer(conn, timeout) for _, conn in self.workers]
        self.result.startup_s = max(seconds for _, seconds, _ in answers)
        failed = [why for _, _, found in answers for why in found]
        self.result.problems.update(f"did not start: {why}"[:300] for why in failed)
        if len(failed) <= self.config.members // 100:  # a few are reported, not fatal
            return True
        self.result.not_started = (
            f"{len(failed)} of {self.config.members} members had not started after "
            f"{self.result.startup_s:.0f} s (the first: {failed[0][:300]})"
        )
        print(f"  {self.config.label}: {self.result.not_started}", flush=True)
        self.probe.phase = None
        self.result.probe = dict(self.probe.samples)
        self._stack.close()  # its members, proxies and moto stop now
        return False

    def send(self, *command: Any) -> list[Any]:
        for _, conn in self.workers:
            conn.send(command)
        return [self._answer(conn, 600) for _, conn in self.workers]

    def ask(self, worker: int, *command: Any) -> Any:
        conn = self.workers[worker][1]
        conn.send(command)
        return self._answer(conn, 600)

    def _answer(self, conn: Connection, timeout: float) -> Any:
        if not conn.poll(timeout):
            raise TimeoutError(f"{self.config.label}: a worker did not answer in {timeout:g} s")
        answer = conn.recv()
        if isinstance(answer, tuple) and answer and answer[0] == "failed":
            raise RuntimeError(f"{self.config.label}: {answer[1]}")
        return answer

    @property
    def pids(self) -> dict[str, list[int]]:
        members = [p.pid for p, _ in self.workers if p.pid is not None]
        return {"moto": [self.moto.pid], "proxies": [self.counters.pid], "members": members}

    def _stop_workers(self) -> None:
        for _, conn in self.workers:
            with contextlib.suppress(OSError):
                conn.send(("stop",))
        for process, conn in self.workers:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()
            conn.close()

    # --- measuring --------------------------------------------------------------------------

    def count(self, begin: float, end: float, cpu: dict[str, float]) -> None:
        found = self.counters.counts(begin, end)
        result = self.result
        result.minutes = (end - begin) / 60.0
        result.fleet, result.upkeep = found["fleet"], found["upkeep"]
        result.cpu = {role: seconds / result.minutes for role, seconds in cpu.items()}
        periods = self.args.cadences.periods(self.config.fanout)
        runs: Counter[str] = Counter()
        for stats in self.send("stats", begin, end):
            runs.update(stats["runs"])
            for action, late in stats["late"].items():
                result.late[action] = max(result.late.get(action, 0.0), percentile(late, 99))
            result.problems.update(stats["errors"])
            result.problems.update(stats["logged"])
        for action, period in periods.items():
            if action == "upkeep":  # the sample's phases put one run each in the window
                due = self.upkeep_members * max(1, math.floor((end - begin) / period))
            else:
                due = self.config.members * (end - begin) / period
            result.done[action] = runs[action] / due if due else 0.0
        result.upkeep_runs = runs["upkeep"]
        result.upkeep_period = periods["upkeep"]

    @property
    def upkeep_members(self) -> int:
        return self.result.upkeep_members

    def propagate(self, changes: int, timeout: float, rng: random.Random) -> None:
        """``changes`` changes of the desired state through the first member, each read by
        every other member (or ``timeout`` s passed) before the next."""
        for k in range(-1, changes):  # the first, not counted, warms moto's fan-out up
            if k == 0:
                self.result.changes.clear()
            model = self.models[k % len(self.models)]
            cpu = {role: cpu_seconds(pids) for role, pids in self.pids.items()}
            try:
                began, ended, generation = self.ask(0, "swap", model, f"r{1 + k % 2}")
            except RuntimeError as exc:  # the store did not answer the writer in time
                self.result.problems[f"a change failed: {exc}"[:300]] += 1
                self.result.failed_changes += 1
                continue
            deadline = began + timeout
            reads: list[float] = []
            heard: list[float] = []
            missing = 0
            for i, times in enumerate(self.send("collect", model, generation, deadline)):
                for j, found in enumerate(times):
                    if i == 0 and j == 0:
                        continue  # the writer: it made the change
                    if found is None:
                        missing += 1
                        continue
                    heard_at, read_at = found
                    reads.append(read_at - began)
                    if heard_at is not None:
                        heard.append(heard_at - began)
            spread = time.perf_counter() - began  # until the last read (or the deadline)
            used = {role: cpu_seconds(pids) - cpu[role] for role, pids in self.pids.items()}
            change = Change(ended - began, reads, heard, missing, spread, used)
            self.result.changes.append(change)
            time.sleep(rng.uniform(1.0, 2.0))


# --- groups of fleets --------------------------------------------------------------------------


def expected_rate(config: Config, args: argparse.Namespace) -> float:
    """Requests per second the fleet should make while idle, from the cadences alone (with
    the fan-out, a long poll per member every 20 s too)."""
    periods: dict[str, float] = args.cadences.periods(config.fanout)
    per_member = 1 / periods["beat"] + 1 / periods["name check"] + 1 / periods["desired"]
    per_member += 1 / periods["releases"]  # a full scan: one listing of the whole store
    upkeep: int = min(config.members, max(1, args.upkeep_gets // config.members))
    if config.fanout:
        per_member += 1 / WAIT_SECONDS
    return config.members * per_member + upkeep * (1 + config.members) / periods["upkeep"]


def plan(configs: Sequence[Config], args: argparse.Namespace) -> list[list[Config]]:
    """Groups of fleets run side by side: a fleet of 1,000 or more alone, the others packed
    (the heaviest first) while their expected rates add up to at most ``--group-rate``."""
    groups: list[list[Config]] = []
    rates: list[float] = []
    for config in sorted(configs, key=lambda c: -expected_rate(c, args)):
        rate = expected_rate(config, args)
        for i, group in enumerate(groups):
            alone = config.members >= 1000 or any(c.members >= 1000 for c in group)
            if not alone and rates[i] + rate <= args.group_rate:
                group.append(config)
                rates[i] += rate
                break
        else:
            groups.append([config])
            rates.append(rate)
    return groups


def run_group(group: Sequence[Config], root: Path, args: argparse.Namespace) -> list[FleetResult]:
    rng = random.Random(args.seed)
    with contextlib.ExitStack() as stack:
        fleets = [stack.enter_context(SimFleet(c, root / slug(c), args)) for c in group]
        moto = [f.moto.pid for f in fleets]
        floor = cpu_seconds(moto)
        time.sleep(args.floor_seconds)
        floor = cpu_seconds(moto) - floor  # all of them: each alike
        for fleet in fleets:
            fleet.result.moto_floor = floor / len(fleets) / (args.floor_seconds / 60)
            fleet.probe.phase = "start"
            fleet.start(rng)
        started = [fleet for fleet in fleets if fleet.ready(args.start_timeout + 300)]
        results = [fleet.result for fleet in fleets]
        fleets = started
        if not fleets:
            return results
        for fleet in fleets:
            fleet.probe.phase = None
        begin = time.perf_counter() + 3.0
        for fleet in fleets:
            fleet.send("go", begin)
        time.sleep(max(0.0, begin - time.perf_counter()))
        for fleet in fleets:
            fleet.probe.phase = "idle"
        load = os.getloadavg()[0]
        cpu = [{r: cpu_seconds(p) for r, p in f.pids.items()} for f in fleets]
        time.sleep(args.window)
        end = time.perf_counter()
        for fleet, before in zip(fleets, cpu, strict=True):
            used = {r: cpu_seconds(p) - before[r] for r, p in fleet.pids.items()}
            fleet.probe.phase = None
            fleet.count(begin, end, used)
            fleet.result.load = (load, os.getloadavg()[0])
            fleet.send("pause")
            print(f"  {fleet.config.label}, idle: {idle_summary(fleet.result)}", flush=True)
        for fleet in fleets:
            fleet.send("resume")
            timeout = 120.0 if fleet.config.fanout else args.cadences.poll + 60.0
            fleet.probe.phase = "spread"
            fleet.propagate(args.changes, timeout, rng)
            fleet.probe.phase = None
            fleet.result.probe = dict(fleet.probe.samples)
            fleet.send("pause")
            print(f"  {fleet.config.label}: {summary(fleet.result)}", flush=True)
        return results


def slug(config: Config) -> str:
    return f"n{config.members}-m{config.models}-{'fanout' if config.fanout else 'polling'}"


def idle_summary(result: FleetResult) -> str:
    groups = ("beat", "name check", "desired", "releases", "upkeep")
    split = ", ".join(f"{g} {result.group('S3', g):.2f}" for g in groups)
    cpu = ", ".join(f"{role} {s:.1f}" for role, s in result.cpu.items())
    done = ", ".join(f"{a} {v:.2f}" for a, v in result.done.items())
    late = ", ".join(f"{a} {v:.2f}" for a, v in result.late.items())
    return (
        f"S3 {result.s3():.2f} per member per minute ({split}), SQS "
        f"{result.group('SQS', 'all'):.2f}; CPU s/min: {cpu} (moto alone "
        f"{result.moto_floor:.2f}); done/due: {done}; late p99 s: {late}; problems: "
        f"{dict(result.problems.most_common(3))}"
    )


def summary(result: FleetResult) -> str:
    reads, heard = result.reads, result.heard
    return (
        f"propagation: queue said so p50 {percentile(heard, 50):.2f} s p99 "
        f"{percentile(heard, 99):.2f} s; read p50 {percentile(reads, 50):.2f} s p99 "
        f"{percentile(reads, 99):.2f} s; {sum(c.missing for c in result.changes)} not read in "
        f"time, {result.failed_changes} failed; CPU busy meanwhile (cores): "
        f"{', '.join(f'{role} {v:.2f}' for role, v in result.busy().items())}"
    )


# --- main ----------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--fleets",
        default=FLEETS,
        help=f"members x models of each fleet with the fan-out (default {FLEETS})",
    )
    parser.add_argument(
        "--polling-fleets",
        default=POLLING,
        help=f"members x models of each fleet without notifications (default {POLLING})",
    )
    parser.add_argument(
        "--window", type=float, default=300.0, help="idle window in s (default 300: a full scan)"
    )
    parser.add_argument(
        "--changes", type=int, default=5, help="changes of the desired state per fleet (5)"
    )
    parser.add_argument(
        "--upkeep-gets",
        type=int,
        default=2_000,
        help="the upkeep runs on at most this many / N members (default 2000)",
    )
    parser.add_argument("--per-worker", type=int, default=250, help="members per process (250)")
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=600.0,
        help="s for a fleet's members to start; a fleet that does not is not measured (600)",
    )
    parser.add_argument(
        "--group-rate",
        type=float,
        default=40.0,
        help="fleets run side by side up to this many expected requests/s in all (40)",
    )
    parser.add_argument(
        "--floor-seconds", type=float, default=10.0, help="moto alone, before members (10)"
    )
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--workdir", type=Path, help="a new dir to keep (moto's logs)")
    parser.add_argument("--write-readme", action="store_true", help="update bench/README.md")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: {QUICK[0]} with the fan-out, {QUICK[1]} without, a 60 s window, "
        "3 changes",
    )
    args = parser.parse_args(argv)
    given = list(sys.argv[1:] if argv is None else argv)
    if "--workdir" in given:  # a path of this machine: not for the README
        at = given.index("--workdir")
        del given[at : at + 2]
    args.command = " ".join(shlex.quote(a) for a in given if not a.startswith("--workdir="))
    if args.quick:
        args.fleets, args.polling_fleets, args.window, args.changes = (*QUICK, 60.0, 3)
    args.cadences = Cadences()
    try:
        args.configs = [
            Config(int(n), int(m), fanout)
            for fanout, fleets in ((True, args.fleets), (False, args.polling_fleets))
            for n, m in (fleet.split("x") for fleet in fleets.split(",") if fleet)
        ]
    except ValueError:
        parser.error("--fleets and --polling-fleets: <members>x<models>, comma-separated")
    if min((min(c.members, c.models) for c in args.configs), default=0) < 1:
        parser.error("at least one fleet; members and models: at least 1")
    if args.window <= 0 or args.changes < 1:
        parser.error("--window: above 0; --changes: at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    began = time.perf_counter()
    groups = plan(args.configs, args)
    results: list[FleetResult] = []
    with contextlib.ExitStack() as keep:
        if args.workdir is None:
            root = Path(keep.enter_context(tempfile.TemporaryDirectory(prefix="fleet-scale-")))
        else:
            root = args.workdir
            root.mkdir(parents=True)
        for i, group in enumerate(groups, 1):
            print(f"group {i} of {len(groups)}: {', '.join(c.label for c in group)}", flush=True)
            results += run_group(group, root / f"group{i}", args)
    took = time.perf_counter() - began
    machine = f"{host()}; the bench took {took / 60:.0f} min"
    text = section(args, machine, results)
    print(f"\n{text}")
    if args.write_readme:
        write_readme(text)
        print(f"\nwrote {README}")
    return 0


if __name__ == "__main__":
    run_main(main)
