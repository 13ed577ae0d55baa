"""Fleet rollouts: from one member's API call to every member serving, against a fleet of one.

A deploy through any member (``POST /v1/models/<m>/deploy {"wait": true, "fleet": true}``)
deploys on that member first and, once it serves, publishes the desired state in the store; the
other members read it every ``store.poll_interval_seconds`` and follow, each through its own
deploy. So a fleet rollout costs the receiving member's deploy, up to one poll interval, then
the followers' deploys. The issue's target: every member serves within one single-member deploy
plus one poll interval plus 1 s. This bench measures that against the real bundled Triton (CPU)
and real daemon processes, one Triton and one daemon per member, in the same run:

* Fleets of 1 (the baseline: a single member's deploy, with the same ``fleet: true`` call),
  2, 3 and 4 members, each on a directory store of its own, all running at once; each run
  deploys the next release once on every fleet, in an order that rotates between runs. Done
  once with the default poll interval (10 s) and once with 1 s, so the poll's share shows.
* The clock starts at the API call. "Every member serving" is when the last member's clients
  first got the new release's answer from its Triton; the API's own fleet-wait answer is timed
  too. The daemons' records split the time: the receiving member's call to ``publish``, each
  follower's wait for its poll (publish -> its operation created) and its own deploy.
* Clients (gRPC, each paced at one request per ``--every`` s) on every member of the fleet that
  rolls out, from before the call until every member serves and answered a few more times:
  failed requests, answers that go back to the older release, answers of no release.

Why each fleet's deploy waits: (a) a random pause of up to one poll interval before it, because
a follower's passes are timed from the end of its last follow, so back-to-back rollouts would
always land at the same point of its poll cycle; (b) at least 35 s after the fleet's previous
rollout, so the previous slot has been retired (``retire_after_seconds``, 30 s by default) and
every deploy does the same work (load the idle slot, no ``free`` step).

The idle store traffic (S3 through a counting proxy, and a directory store under strace) is
measured by :mod:`bench.fleet_store`, before the rollouts. Run from the repo root:
``.venv/bin/python bench/fleet.py [--quick] [--write-readme]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fleet_members import (
    MemberClients,
    Tritons,
    counts,
    deployed,
    fleet_deploy,
    intervals,
    log_problems,
    wait_ready,
)
from bench.fleet_report import section, table, verdict, write_readme
from bench.fleet_store import IdleCounts, idle_store_traffic
from bench.report import README, run_main
from bench.rollback import perf_of, wait_until
from tests.support.fleet import Fleet, Member
from tests.support.models import write_scale_release

MODEL = "fleet"
SIZES = (1, 2, 3, 4)  # a fleet of one is the baseline
POLLS = (10.0, 1.0)  # store.poll_interval_seconds: the default, and a short one
BEAT = 5.0  # fleet.keepalive_seconds: its default when measured, 60 s since (the tests set 1 s)
RETIRED = 35.0  # s after a rollout: the old slot retired (retire_after_seconds 30 s + margin)


def value_of(release: int) -> float:
    """What r<i> answers for INPUT0 = 1."""
    return float(release + 1)


# --- the fleets ----------------------------------------------------------------------------


@dataclass
class Phase:
    """Every fleet of one poll interval, running at once."""

    poll: float
    fleets: dict[int, Fleet] = field(default_factory=dict)
    settled_at: dict[int, float] = field(default_factory=dict)  # last rollout done
    problems: Counter[str] = field(default_factory=Counter)  # the daemons' warnings, errors


@contextlib.contextmanager
def phase(root: Path, poll: float, args: argparse.Namespace) -> Iterator[Phase]:
    """The fleets of ``args.sizes`` on stores of their own, r0 serving on every member."""
    tritons = Tritons()
    bench = Phase(poll)
    fleets = bench.fleets
    began = time.perf_counter()
    try:
        for size in args.sizes:
            base = root / f"poll{poll:g}-fleet{size}"
            store = base / "store"
            for release in range(args.runs + 1):
                write_scale_release(store, MODEL, f"r{release}", k=value_of(release))
            env = intervals(poll, BEAT)
            fleets[size] = Fleet(store=store, tritons=tritons, root=base, model=MODEL, env=env)
            for _ in range(size):
                fleets[size].add(wait_ready=False)
        members = [m for fleet in fleets.values() for m in fleet.members]
        wait_ready(members, timeout=300)
        ready = time.perf_counter()
        with ThreadPoolExecutor(len(fleets)) as pool:  # r0 everywhere, not measured
            list(pool.map(lambda fleet: deployed(fleet.members[0], MODEL, "r0"), fleets.values()))
        now = time.perf_counter()
        print(
            f"poll {poll:g} s: {len(members)} members ready in {ready - began:.0f} s, serving r0 "
            f"{now - ready:.0f} s later",
            flush=True,
        )
        # The first rollout loads the slot r0 left empty: no retire to wait for.
        bench.settled_at = dict.fromkeys(fleets, float("-inf"))
        yield bench
    finally:
        for fleet in fleets.values():
            fleet.stop()
        tritons.stop()  # after the daemons, which never see their Triton vanish mid-call
        bench.problems = log_problems([m for fleet in fleets.values() for m in fleet.members])


# --- one rollout ---------------------------------------------------------------------------


def follower_operation(member: Member, release: str) -> dict[str, Any]:
    """The operation through which ``member`` followed the fleet to ``release``."""
    answer = member.api.get(f"/v1/operations?model={MODEL}&limit=10")
    answer.raise_for_status()
    for operation in answer.json()["operations"]:
        if operation["release"] == release and operation["trigger"] == "fleet":
            found: dict[str, Any] = operation
            return found
    raise RuntimeError(f"{member.name} has no fleet operation to {release}")


def step(operation: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((s for s in operation["steps"] if s["name"] == name), None)


def rollout(bench: Phase, size: int, release: int, args: argparse.Namespace) -> dict[str, float]:
    """Deploy r<release> through one member of the fleet of ``size``, under client load."""
    fleet = bench.fleets[size]
    members = fleet.members
    leader = members[release % size]  # the receiving member rotates
    new, old = value_of(release), value_of(release - 1)
    urls = [m.triton.grpc_url for m in members]
    timeout = bench.poll + 300
    with MemberClients(urls, MODEL, args.clients, args.every, timeout + 60) as clients:
        clients.settle(answers=5, timeout=60)
        with leader.api.client() as http:  # see fleet_deploy: a connection of its own
            begin = time.perf_counter()
            answer = fleet_deploy(http, MODEL, f"r{release}")
            answered = time.perf_counter()
        if answer.status_code != 200:
            raise RuntimeError(f"fleet of {size}, r{release}: {answer.status_code} {answer.text}")
        wait_until(
            lambda: all(clients.first(i, new) is not None for i in range(size)),
            timeout,
            f"every member of the fleet of {size} answering r{release}",
            every=0.05,
        )
        clients.settle(answers=5, timeout=60)
    seen = [clients.first(i, new) or float("nan") for i in range(size)]
    operation = answer.json()["operation"]
    out: dict[str, float] = {
        "all_s": max(seen) - begin,
        "api_s": answered - begin,
        "leader_op_s": float(operation["duration_seconds"] or 0.0),
        "leader_seen_s": seen[members.index(leader)] - begin,
    }
    free = step(operation, "free") is not None
    if size > 1:
        published = perf_of(str((step(operation, "publish") or {})["finished_at"]))
        followed = [follower_operation(m, f"r{release}") for m in members if m is not leader]
        free = free or any(step(op, "free") is not None for op in followed)
        waits = [perf_of(op["created_at"]) - published for op in followed]
        told = [  # each follower's serving time had it been told at the publish
            seen[members.index(m)] - wait
            for m, wait in zip([m for m in members if m is not leader], waits, strict=True)
        ]
        ends = [perf_of(op["finished_at"]) for op in followed]
        durations = [float(op["duration_seconds"] or 0.0) for op in followed]
        loads = [float((step(op, "load") or {}).get("duration_seconds") or 0.0) for op in followed]
        out |= {
            "publish_s": published - begin,
            "wait_max_s": max(waits),
            "wait_min_s": min(waits),
            "told_s": max(out["leader_seen_s"], *told) - begin,
            "follower_op_max_s": max(durations),
            "follower_load_max_s": max(loads),
            "after_publish_s": max(seen) - published,
            "api_after_all_s": answered - max(seen),
            "api_after_ops_s": answered - max(ends),
        }
    out |= counts(clients, new, old)
    out["free_steps"] = float(free)
    for error in sorted(set(clients.errors))[:5]:
        print(f"  error: {error}", flush=True)
    return out


def pause_before(bench: Phase, size: int) -> None:
    """The old slot retired, then a random point of the followers' poll cycle."""
    time.sleep(max(0.0, bench.settled_at[size] + RETIRED - time.perf_counter()))
    if size > 1:
        time.sleep(random.uniform(0.0, bench.poll))


def run_phase(
    root: Path, poll: float, args: argparse.Namespace
) -> tuple[list[dict[str, float]], Counter[str]]:
    """Every run of one poll interval (one rollout per fleet, keys ``<size>_<metric>``), and
    the warnings and errors the daemons logged."""
    runs: list[dict[str, float]] = []
    with phase(root, poll, args) as bench:
        for run in range(1, args.runs + 1):
            result: dict[str, float] = {}
            shift = (run - 1) % len(args.sizes)
            for size in args.sizes[shift:] + args.sizes[:shift]:
                pause_before(bench, size)
                found = rollout(bench, size, run, args)
                bench.settled_at[size] = time.perf_counter()
                result |= {f"{size}_{key}": value for key, value in found.items()}
                extra = (
                    f" (API {found['api_s']:.2f} s, wake wait up to {found['wait_max_s']:.2f} s, "
                    f"followers' deploys up to {found['follower_op_max_s']:.2f} s)"
                    if size > 1
                    else f" (API {found['api_s']:.2f} s)"
                )
                print(
                    f"poll {poll:g} s, run {run}, fleet of {size}: every member serving after "
                    f"{found['all_s']:.2f} s{extra}, {found['failed']:.0f} of "
                    f"{found['requests']:.0f} requests failed",
                    flush=True,
                )
            runs.append(result)
    return runs, bench.problems


# --- main ----------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3, help="runs per poll interval (default 3)")
    polls = ",".join(f"{p:g}" for p in POLLS)
    parser.add_argument(
        "--polls", default=polls, help=f"poll intervals in s, comma-separated (default {polls})"
    )
    parser.add_argument(
        "--clients",
        type=int,
        default=4,
        help="clients per rollout, spread over the fleet's members, at least one each (default 4)",
    )
    parser.add_argument(
        "--every", type=float, default=0.02, help="s between a client's requests (default 0.02)"
    )
    parser.add_argument(
        "--idle-seconds", type=float, default=40.0, help="idle store traffic window (default 40)"
    )
    parser.add_argument(
        "--idle-members", type=int, default=2, help="members per idle fleet (default 2)"
    )
    parser.add_argument(
        "--workdir", type=Path, help="a new dir to run in and keep (logs); default: a temp dir"
    )
    parser.add_argument("--write-readme", action="store_true", help="update bench/README.md")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: poll 1 s, fleets of 1 and 2, 1 run"
    )
    args = parser.parse_args(argv)
    args.sizes = list(SIZES)
    args.polls = [float(p) for p in args.polls.split(",")]
    if args.quick:
        args.runs, args.polls, args.sizes = 1, [1.0], [1, 2]
        args.idle_seconds, args.idle_members = 20.0, 1
    counts = min(args.runs, args.clients, args.idle_members)
    if counts < 1 or args.every <= 0 or min(args.polls) <= 0:
        parser.error("--runs, --clients, --idle-members: at least 1; --every, --polls: above 0")
    return args


def load() -> float:
    """The host's 1-minute load average: other work on the machine shows in every number."""
    return os.getloadavg()[0]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    began = time.perf_counter()
    load_at_start = load()
    with contextlib.ExitStack() as keep:
        if args.workdir is None:
            root = Path(keep.enter_context(tempfile.TemporaryDirectory(prefix="fleet-")))
        else:
            root = args.workdir
            root.mkdir(parents=True)  # a fresh dir: the daemons' logs stay there
        idle: IdleCounts = idle_store_traffic(
            root / "idle",
            args.idle_seconds,
            members=args.idle_members,
            rollout=not args.quick,
        )
        print(f"(idle store traffic: {time.perf_counter() - began:.0f} s in all)", flush=True)
        print(f"{idle.machine}\n\n{idle.summary()}\n", flush=True)
        phases: dict[float, list[dict[str, float]]] = {}
        problems = Counter(idle.problems)
        for poll in args.polls:
            phases[poll], found = run_phase(root / f"poll{poll:g}", poll, args)
            problems.update(found)
    summary = (
        f"{idle.machine}; load average {load_at_start:.1f} at the start, {load():.1f} at the end"
    )
    for message, n in problems.most_common():
        print(f"daemon log: {n} x {message}")
    print(f"\n{verdict(phases, idle)}\n\n{table(phases, idle)}")
    print(f"\n(the whole bench took {time.perf_counter() - began:.0f} s)")
    if args.write_readme:
        write_readme(section(args, summary, phases, idle, problems))
        print(f"\nwrote {README}")
    return 0


if __name__ == "__main__":
    run_main(main)
