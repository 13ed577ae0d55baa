"""Rolling updates behind HAProxy: what a fleet rollout costs beyond each member's own work.

A model that fits once in GPU memory is updated member by member (the ``rolling`` side of
``auto``, the default strategy): each member takes a turn (at most one out of rotation),
leaves rotation (``/readyz`` 503), waits ``rollout.unready_seconds`` for the load balancer to
notice, drains, unloads the old release, waits for the GPU memory to come back, loads the new
one, preflights it, switches, returns to rotation and keeps the turn ``unready_seconds`` more
(``rejoin``), then hands it on. The receiving member rolls first and publishes the desired
state once it serves; the others follow, one turn at a time. So a rollout of N members can
never take less than the sum of their own work plus 2 x ``unready_seconds`` each; the target
is at most 1 s more per member.

This bench builds each fleet the way ``tests/integration/test_rolling_fleet.py`` does
(``tests/support/rolling_fleet.py``): real bundled Tritons (CPU), a daemon beside each, a GPU
stand-in per member whose used memory follows what its Triton has loaded (16 GiB, 9 GiB a
release: it fits once), and Debian's HAProxy in front, balancing every gRPC call and
health-checking each daemon's ``/readyz`` every 300 ms (fall 1, rise 2). Fleets of 2, 3 and 4
members run at once, each on a directory store of its own; each run deploys the next release
once on every fleet (the sizes take turns going first), through one member (a different one each
run) with ``{"wait": true, "fleet": true}``, while clients call the model through HAProxy all
along (:class:`~tests.support.grpc_load.LoadClient`) and a
:class:`~tests.support.haproxy.RotationRecorder` samples who is out of rotation.

Measured per rollout, all in the same run: the wall time from the API call to its answer; each
member's work from its own operation's steps (``GET /v1/operations``): drain (less the
configured wait inside it), unload, memory, load, preflight, switch; the configured waits
(``unready_seconds`` before the drain and in ``rejoin``); the overhead per member
``(wall - sum of work [- configured waits]) / members``, split into where it goes (before the
first turn, inside the turns, between turns, after the last); failed calls through HAProxy and
the most members out of rotation at once.

Run from the repo root: ``.venv/bin/python bench/rolling.py [--quick] [--write-readme]``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fleet_members import Tritons, fleet_deploy, intervals, log_problems
from bench.report import README, machine, run_main
from bench.rollback import perf_of
from bench.rolling_report import section, table, verdict, write_readme
from tests.support.fleet import Fleet, Member
from tests.support.grpc_load import LoadClient
from tests.support.haproxy import RotationRecorder
from tests.support.rolling_fleet import RollingFleet, rolling_fleet, write_big_release

MODEL = "rolling"
SIZES = (2, 3, 4)
UNREADY = 1.0  # rollout.unready_seconds for the bench (the default is 5 s, the tests' 1.5 s)
# store.poll_interval_seconds (its default) and fleet.keepalive_seconds (5 s, its default
# when this was measured; 60 s since)
POLL, BEAT = 10.0, 5.0
UNREADY_ENV = "CONTROLPLANE_MODEL_DEFAULTS__ROLLOUT__UNREADY_SECONDS"
WORK = ("unload", "memory", "load", "preflight", "switch")  # besides the drain's own part
SETTLE = 1.0  # s between rollouts: the last member's beat and HAProxy's rise behind us


def value_of(release: int) -> float:
    """What r<i> answers for INPUT0 = 1."""
    return float(release + 1)


# --- the fleets ----------------------------------------------------------------------------


@dataclass
class Bench:
    fleets: dict[int, RollingFleet] = field(default_factory=dict)
    summary: str = ""
    problems: Counter[str] = field(default_factory=Counter)  # the daemons' warnings, errors


def haproxy_version() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError, IndexError):
        out = subprocess.run(
            ["haproxy", "-v"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
        words = out.split()
        return f"HAProxy {words[2]}"  # "HAProxy version 2.6.12-1+deb12u1 2023/12/04 - ..."
    return "HAProxy"


@contextlib.contextmanager
def fleets(root: Path, args: argparse.Namespace) -> Iterator[Bench]:
    """The fleets of ``args.sizes``, each behind its HAProxy, r0 serving on every member."""
    bench = Bench()
    tritons = Tritons()
    members: list[Member] = []
    began = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            stack.callback(tritons.stop)  # last: after the daemons, which never see it vanish
            for size in args.sizes:
                base = root / f"fleet{size}"
                store = base / "store"
                for release in range(args.runs + 1):
                    write_big_release(store, MODEL, f"r{release}", k=value_of(release))
                fleet = Fleet(
                    store=store,
                    tritons=tritons,
                    root=base / "members",
                    model=MODEL,
                    env=intervals(args.poll, args.beat),
                )
                stack.callback(fleet.stop)  # a member that failed to start: the others stop
                running = stack.enter_context(
                    rolling_fleet(fleet, base, size, **{UNREADY_ENV: f"{args.unready:g}"})
                )
                stack.callback(fleet.stop)  # the daemons first, then HAProxy and the exporters
                members += fleet.members
                bench.fleets[size] = running
            ready = time.perf_counter()
            for running in bench.fleets.values():  # r0 everywhere: a first load, no turns
                with running.members[0].api.client() as http:
                    answer = fleet_deploy(http, MODEL, "r0")
                if answer.status_code != 200:
                    raise RuntimeError(f"r0 on {len(running.members)}: {answer.text[:2000]}")
                running.haproxy.wait_until_up(timeout=30)
            print(
                f"{len(members)} members ready in {ready - began:.0f} s, serving r0 "
                f"{time.perf_counter() - ready:.0f} s later",
                flush=True,
            )
            bench.summary = f"{machine(members[0].triton)}, {haproxy_version()}"
            yield bench
    finally:
        bench.problems = log_problems(members)


# --- one rollout ---------------------------------------------------------------------------


def operation_of(member: Member, release: str) -> dict[str, Any]:
    """``member``'s operation that deployed ``release`` (the latest that did)."""
    answer = member.api.get(f"/v1/operations?model={MODEL}&limit=10")
    answer.raise_for_status()
    found = [
        op
        for op in answer.json()["operations"]
        if op["release"] == release and op["kind"] == "deploy" and op["status"] == "succeeded"
    ]
    if not found:
        raise RuntimeError(f"{member.name} has no succeeded deploy of {release}")
    latest: dict[str, Any] = max(found, key=lambda op: str(op["created_at"]))
    return latest


def step(operation: dict[str, Any], name: str, last: bool = False) -> dict[str, Any]:
    """The operation's step ``name`` (its last one of that name with ``last``)."""
    steps: list[dict[str, Any]] = [s for s in operation["steps"] if s["name"] == name]
    if not steps:
        raise RuntimeError(f"operation {operation['id']} has no {name} step")
    return steps[-1] if last else steps[0]


def seconds(operation: dict[str, Any], name: str) -> float:
    return float(step(operation, name)["duration_seconds"] or 0.0)


@dataclass(frozen=True)
class Turn:
    """One member's turn, from its operation: when it held it, and what it did in it."""

    member: str
    operation: dict[str, Any]
    taken: float  # the turn step's end (perf_counter scale)
    back: float  # the rejoin step's end: the turn is given back right after
    steps: dict[str, float]  # work, by step ("drain" less the configured wait)
    waits: float  # the configured waits: unready_seconds before the drain, and in rejoin

    @property
    def work(self) -> float:
        return sum(self.steps.values())


def turn_of(member: Member, operation: dict[str, Any], configured: float) -> Turn:
    drain = step(operation, "drain")
    unready = float(drain["detail"].get("unready_seconds", configured))
    steps = {"drain": float(drain["duration_seconds"]) - unready}
    steps |= {name: seconds(operation, name) for name in WORK}
    return Turn(
        member=member.name,
        operation=operation,
        taken=perf_of(str(step(operation, "turn")["finished_at"])),
        back=perf_of(str(step(operation, "rejoin", last=True)["finished_at"])),
        steps=steps,
        waits=unready + unready,  # the rejoin waits unready_seconds too, by design
    )


def rollout(running: RollingFleet, release: int, args: argparse.Namespace) -> dict[str, float]:
    """Deploy r<release> through one member of ``running`` under load through HAProxy."""
    members = running.members
    size = len(members)
    via = members[release % size]  # the receiving member rotates
    name, new, old = f"r{release}", value_of(release), value_of(release - 1)
    running.haproxy.wait_until_up(timeout=30)
    with (
        RotationRecorder(running.haproxy) as rotation,
        LoadClient(
            running.haproxy.frontend_url,
            MODEL,
            callers=args.callers,
            pause=args.pause,
            max_seconds=300.0,
        ) as load,
    ):
        load.wait_for_answers(20)
        with via.api.client() as http:  # a fresh connection, built before the clock starts
            begin = time.perf_counter()
            answer = fleet_deploy(http, MODEL, name)
            answered = time.perf_counter()
        if answer.status_code != 200:
            raise RuntimeError(f"fleet of {size}, {name}: {answer.status_code} {answer.text}")
        running.haproxy.wait_until_up(timeout=30)
        load.wait_for_answers(20)
    summary = load.stop()
    for member in members:
        if member.answer(MODEL) != new:
            raise RuntimeError(f"fleet of {size}: {member.name} does not answer {name}")

    turns = sorted(
        (turn_of(m, operation_of(m, name), args.unready) for m in members),
        key=lambda turn: turn.taken,
    )
    wall = answered - begin
    work = sum(turn.work for turn in turns)
    waits = sum(turn.waits for turn in turns)
    inside = sum(turn.back - turn.taken - turn.work - turn.waits for turn in turns)
    gaps = [after.taken - before.back for before, after in itertools.pairwise(turns)]
    leader = next(t for t in turns if t.member == via.name)
    if turns[0] is not leader:
        raise RuntimeError(f"fleet of {size}, {name}: {turns[0].member} rolled before {via.name}")
    first = turns[1]  # the first follower: it heard of the release at the publish
    published = perf_of(str(step(leader.operation, "publish")["finished_at"]))
    heard = perf_of(str(first.operation["created_at"]))
    stretches = [s.end - s.start for s in rotation.out_of_rotation() if s.end is not None] or [
        float("nan")
    ]
    out: dict[str, float] = {
        "wall_s": wall,
        "per_member_s": wall / size,
        "work_s": work,
        "work_member_s": work / size,
        "waits_s": waits,
        "baseline_s": work + waits,
        "ratio": wall / (work + waits),
        "over_ex_s": (wall - work - waits) / size,
        "over_in_s": (wall - work) / size,
        "before_s": turns[0].taken - begin,
        "inside_s": inside,
        "between_s": sum(gaps),
        "after_s": answered - turns[-1].back,
        "publish_s": published - leader.back,
        "wake_s": heard - published,
        "prepare_s": first.taken - heard,
        "first_gap_s": gaps[0],
        "out_max_s": max(stretches),
        "out_median_s": statistics.median(stretches),
        "max_out": float(rotation.max_out_at_once),
        "left_not_once": float(sum(rotation.left_rotation(m.name) != 1 for m in members)),
        "requests": float(summary.calls),
        "failed": float(len(summary.failures)),
        "unexpected": float(sum(n for v, n in summary.answers.items() if v not in (new, old))),
    }
    if len(gaps) > 1:
        out["later_gap_s"] = statistics.mean(gaps[1:])
    for key in ("drain", *WORK):
        out[f"{key}_s"] = statistics.mean(turn.steps[key] for turn in turns)
    for failure in summary.failures[:5]:
        print(f"  failed call: {failure}", flush=True)
    return out


def run_all(bench: Bench, args: argparse.Namespace) -> list[dict[str, float]]:
    """Every run: one rollout per fleet (keys ``<size>_<metric>``), the sizes taking turns
    going first."""
    runs: list[dict[str, float]] = []
    for run in range(1, args.runs + 1):
        result: dict[str, float] = {}
        shift = (run - 1) % len(args.sizes)
        for size in args.sizes[shift:] + args.sizes[:shift]:
            time.sleep(SETTLE)
            found = rollout(bench.fleets[size], run, args)
            result |= {f"{size}_{key}": value for key, value in found.items()}
            print(
                f"run {run}, fleet of {size}: {found['wall_s']:.2f} s (work {found['work_s']:.2f} "
                f"s, configured waits {found['waits_s']:.2f} s; overhead per member "
                f"{found['over_ex_s']:.2f} s beyond both), {found['failed']:.0f} of "
                f"{found['requests']:.0f} calls failed, at most {found['max_out']:.0f} out",
                flush=True,
            )
        runs.append(result)
    return runs


# --- main ----------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5, help="rollouts per fleet (default 5)")
    parser.add_argument(
        "--callers", type=int, default=3, help="gRPC callers through HAProxy (default 3)"
    )
    parser.add_argument(
        "--pause", type=float, default=0.01, help="s each caller waits between calls (0.01)"
    )
    parser.add_argument(
        "--unready-seconds",
        dest="unready",
        type=float,
        default=UNREADY,
        help=f"rollout.unready_seconds of every member (default {UNREADY:g})",
    )
    parser.add_argument(
        "--workdir", type=Path, help="a new dir to run in and keep (logs); default: a temp dir"
    )
    parser.add_argument("--write-readme", action="store_true", help="update bench/README.md")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: fleets of 2 and 3, 1 rollout each"
    )
    args = parser.parse_args(argv)
    args.sizes = list(SIZES)
    args.poll, args.beat = POLL, BEAT
    if args.quick:
        args.runs, args.sizes = 1, [2, 3]
    if args.runs < 1 or args.callers < 1 or args.pause < 0 or args.unready <= 0:
        parser.error("--runs, --callers: at least 1; --pause: 0 or more; --unready-seconds: > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    began = time.perf_counter()
    load_at_start = os.getloadavg()[0]
    with contextlib.ExitStack() as keep:
        if args.workdir is None:
            root = Path(keep.enter_context(tempfile.TemporaryDirectory(prefix="rolling-")))
        else:
            root = args.workdir
            root.mkdir(parents=True)  # a fresh dir: the daemons' and HAProxy's logs stay there
        with fleets(root, args) as bench:
            runs = run_all(bench, args)
    summary = (
        f"{bench.summary}; load average {load_at_start:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end"
    )
    for message, n in bench.problems.most_common():
        print(f"daemon log: {n} x {message}")
    print(f"\n{verdict(runs, bench.problems, args.unready)}\n\n{table(runs)}")
    print(f"\n(the whole bench took {time.perf_counter() - began:.0f} s)")
    if args.write_readme:
        write_readme(section(args, summary, runs, bench.problems))
        print(f"\nwrote {README}")
    return 0


if __name__ == "__main__":
    run_main(main)
