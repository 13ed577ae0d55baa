"""What an idle member asks of S3 at the default intervals, before and after issue 23's work.

Issue 23 (point 1) moved an idle member's store traffic from "every poll, list everything" to
"every keepalive, one PUT; every poll, a conditional GET of the desired state's index and a
listing per model; with the bucket's events on a queue of its own, nothing on a quiet beat and
one listing of the whole store every full scan". Its targets, per member per minute: with the
SNS fan-out at most 2 requests whatever the number of models; without, the keepalive plus
one listing per model per poll (plus the models' listing and the index GET per poll).

This bench runs, all at once, one member per configuration, each a real daemon beside a real
bundled Triton (CPU), serving the first of the store's models:

* ``before``: the code of :data:`BASELINE` (the last commit before the issue's work), checked out
  with ``git worktree`` and run from there, at its defaults (poll 10 s, heartbeat 5 s), 1 and
  20 models;
* ``after``: this code at its defaults (poll, keepalive, full scan), polling, 1 and 20 models;
* ``fan-out``: the same with ``store.notifications.sns_topic_arn`` (the member makes and
  subscribes its own SQS queue), 1 and 20 models.

Each member has a bucket of its own on one moto server (a process of its own) and a counting
proxy of its own in front of it (:class:`bench.fleet_store.CountingProxy`), through which it
reaches S3, SQS and SNS. Every request is put down to its kind
(:func:`tests.support.s3_kinds.kind_of`, as the idle-cost test does); SQS and SNS are counted
apart. Windows of ``--window`` s (300, one full scan) follow a settle, back to back; the
intervals are never shortened. Run from the repo root:
``.venv/bin/python bench/fleet_idle.py [--quick] [--write-readme]``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Literal

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.fleet_idle_report import print_summary, write_readme
from bench.fleet_members import Tritons, log_problems, wait_ready
from bench.fleet_store import CountingProxy
from bench.report import machine, run_main
from bench.rollback import wait_until
from bench.s3_download import moto_process
from bench.scale import baseline_tree
from controlplane.services.fleet_sync import FORGET_EVERY
from controlplane.settings import FleetSettings, StoreSettings
from tests.support.daemon import Daemon, start_daemon
from tests.support.fleet import Member
from tests.support.models import write_scale_release
from tests.support.s3 import aws_env, notify_topic, s3_client, sns_client, upload_release_dir
from tests.support.s3_kinds import kind_of
from tests.support.stopping import stop_all

BASELINE = "6242ce8"  # the last commit before issue 23's work
BEFORE_DEFAULTS = {"poll": 10.0, "heartbeat": 5.0}  # its defaults (fleet.heartbeat_seconds)
PREFIX = "models"
MODELS = (1, 20)
SETTLE, WINDOW, WINDOWS = 60.0, 300.0, 3
SERVED = "m00"  # the model each member serves; the others only sit in its store


@dataclass(frozen=True)
class Setup:
    """One member's configuration: which code, how many models, the fan-out or not."""

    code: Literal["before", "after"]  # the baseline commit's code, or this code
    models: int
    fan_out: bool = False

    @property
    def name(self) -> str:
        """The member's name, its bucket's and its queue's (``controlplane-<name>``)."""
        variant = "fanout" if self.fan_out else self.code
        return f"{variant}-{self.models}"

    @property
    def label(self) -> str:
        if self.code == "before":
            return f"before, {self.models} model{'s' if self.models > 1 else ''}"
        how = "fan-out" if self.fan_out else "no notifications"
        return f"after, {how}, {self.models} model{'s' if self.models > 1 else ''}"


SETUPS = (
    *(Setup("before", n) for n in MODELS),
    *(Setup("after", n) for n in MODELS),
    *(Setup("after", n, fan_out=True) for n in MODELS),
)


def after_defaults() -> dict[str, float]:
    """This code's defaults, which the ``after`` members run with (none is set)."""
    return {
        "poll": float(StoreSettings.model_fields["poll_interval_seconds"].default),
        "keepalive": float(FleetSettings.model_fields["keepalive_seconds"].default),
        "full_scan": float(StoreSettings.model_fields["full_scan_seconds"].default),
        "forget": FORGET_EVERY,  # departed members looked for: a constant, not a setting
    }


@dataclass
class Measured:
    """Every member's requests by kind in each window, and what the report needs besides."""

    setups: tuple[Setup, ...]
    window_s: float
    baseline: str  # the commit the before members run
    served: str  # the model every member serves
    before_defaults: dict[str, float]
    after_defaults: dict[str, float]
    s3: dict[str, list[Counter[str]]] = field(default_factory=dict)  # setup name -> windows
    queue: dict[str, list[int]] = field(default_factory=dict)  # SQS and SNS, per window
    machine: str = ""
    idle_since: datetime | None = None  # the settle's start: every member serving
    problems: Counter[str] = field(default_factory=Counter)  # the daemons' warnings, errors
    idle_problems: Counter[str] = field(default_factory=Counter)  # of which since idle_since


# --- the members ---------------------------------------------------------------------------


def publish(client: Any, bucket: str, built: Path, models: int) -> None:
    """The first ``models`` of the releases built under ``built`` (r1 of each) into ``bucket``."""
    client.create_bucket(Bucket=bucket)
    for n in range(models):
        upload_release_dir(client, bucket, PREFIX, built / f"m{n:02d}" / "r1")


def before_code(tree: Path) -> dict[str, str]:
    """The environment that runs the baseline's code from ``tree``: ``python -m`` puts the
    working directory (this repo) first on sys.path, ahead of PYTHONPATH, unless
    PYTHONSAFEPATH leaves it out."""
    return {"PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}


def prepare(tree: Path) -> None:
    """Triton's protocol module generated in the baseline's tree (it is not committed), and a
    check that a process started here as the members are imports the package from there."""
    env = {**os.environ, **before_code(tree)}
    generate = [sys.executable, "-m", "controlplane.adapters.triton.generate_protos"]
    subprocess.run(generate, env=env, cwd=tree, check=True, capture_output=True)
    where = [sys.executable, "-c", "import controlplane; print(controlplane.__file__)"]
    found = subprocess.run(where, env=env, check=True, capture_output=True, text=True).stdout
    if not Path(found.strip()).is_relative_to(tree):
        raise RuntimeError(f"the before members would run {found.strip()}, not {tree}'s code")


def member_env(setup: Setup, before_tree: Path, topic: str | None) -> dict[str, str]:
    """What a member is told besides where its Triton, repository and store are: its name and,
    for the fan-out, the topic. No interval: each code runs at its own defaults."""
    env = {"CONTROLPLANE_FLEET__MEMBER": setup.name}
    if setup.code == "before":
        env |= before_code(before_tree)
    if topic is not None:
        env["CONTROLPLANE_STORE__NOTIFICATIONS__SNS_TOPIC_ARN"] = topic
    return env


def start_member(
    setup: Setup, tritons: Tritons, root: Path, endpoint: str, env: Mapping[str, str]
) -> Member:
    """A Triton and a daemon of ``setup``'s code on its bucket, reached through ``endpoint``.

    Not the tests' ``Fleet``: it sets the keepalive, which the baseline's settings refuse
    (it knew only ``fleet.heartbeat_seconds``), and the bench wants every interval at its
    default."""
    workdir = root / setup.name
    (workdir / "repository").mkdir(parents=True)
    member = Member(setup.name, tritons(workdir / "repository"), workdir)
    member.daemon = start_daemon(
        triton=member.triton,
        store=workdir / "unused",
        store_uri=f"s3://{setup.name}/{PREFIX}",
        workdir=workdir,
        extra_env={**aws_env(endpoint), **env},
        log_name="daemon.log",
        wait_ready=False,
    )
    return member


def serve_first(member: Member) -> None:
    """Deploy the first model's r1 and wait until its Triton answers with it (k = 1)."""
    answer = member.api.deploy(SERVED, "r1")
    if answer.status_code != 200:
        raise RuntimeError(f"{member.name}: deploy {SERVED} r1: {answer.text[:2000]}")
    wait_until(lambda: _answers(member), 60, f"{member.name} serving {SERVED}", every=0.5)


def _answers(member: Member) -> bool:
    with contextlib.suppress(Exception):
        return member.answer(SERVED) == 1.0
    return False


def hears_its_queue(member: Member) -> bool:
    health = member.api.get("/healthz").json()["store"]["notifications"]
    return bool(health["state"] == "live")


@dataclass
class Running:
    """Every setup's member, serving, and the proxy each reaches the store through."""

    members: list[Member]
    proxies: dict[str, CountingProxy]  # by setup name
    machine: str


@contextlib.contextmanager
def running(root: Path, measured: Measured) -> Iterator[Running]:
    """Every setup's member running and serving until the block ends; then everything it
    started stopped, and the daemons' warnings and errors noted in ``measured``."""
    built = root / "releases"
    for n in range(max(MODELS)):
        write_scale_release(built, f"m{n:02d}", "r1", k=1.0)
    started: list[Member] = []
    with contextlib.ExitStack() as stack:
        before_tree = stack.enter_context(baseline_tree(BASELINE, root / "before-code"))
        prepare(before_tree)
        endpoint = stack.enter_context(moto_process(root / "moto.log"))
        s3, sns = s3_client(endpoint), sns_client(endpoint)
        stack.callback(s3.close)
        stack.callback(sns.close)
        tritons = Tritons()
        stack.callback(tritons.stop)  # after every daemon has stopped
        proxies: dict[str, CountingProxy] = {}
        for setup in SETUPS:  # stopped after the daemons, which must not see S3 vanish
            proxies[setup.name] = CountingProxy(endpoint)
            stack.enter_context(proxies[setup.name])
        # Runs once the daemons stopped (callbacks run last first): their logs are complete.
        stack.callback(lambda: note_problems(measured, started))
        stack.callback(lambda: stop_all([m.api for m in started], Daemon.stop))
        for setup in SETUPS:
            publish(s3, setup.name, built, setup.models)
            topic = (
                notify_topic(s3, sns, setup.name, PREFIX, f"idle-{setup.name}")
                if setup.fan_out
                else None
            )
            env = member_env(setup, before_tree, topic)
            started.append(start_member(setup, tritons, root, proxies[setup.name].endpoint, env))
        wait_ready(started, timeout=300)
        with ThreadPoolExecutor(len(started)) as pool:
            list(pool.map(serve_first, started))
        for setup, member in zip(SETUPS, started, strict=True):
            if setup.fan_out:
                wait_until(
                    partial(hears_its_queue, member),
                    60,
                    f"{member.name} hearing its queue",
                    every=0.5,
                )
        print(f"{len(started)} members serving {SERVED}", flush=True)
        yield Running(started, proxies, machine(started[0].triton))


def note_problems(measured: Measured, started: Sequence[Member]) -> None:
    """The daemons' warnings and errors: all of them, and those once every member served."""
    measured.problems = log_problems(started)
    if measured.idle_since is not None:
        measured.idle_problems = log_problems(started, since=measured.idle_since)


def count_windows(measured: Measured, fleet: Running, args: argparse.Namespace) -> None:
    """Sleep through the settle and the windows (checking that every daemon lives), then put
    each proxy's requests down to their kind, window by window."""
    measured.idle_since = datetime.now(UTC)
    begin = time.perf_counter() + args.settle
    edges = [begin + i * args.window for i in range(args.windows + 1)]
    while (now := time.perf_counter()) < edges[-1]:
        dead = [m.name for m in fleet.members if m.api.process.poll() is not None]
        if dead:
            raise RuntimeError(f"daemons exited while idle: {dead}")
        done = sum(edge <= now for edge in edges)
        state = f"window {done} of {args.windows}" if done else "settling"
        print(f"  {state}, {edges[-1] - now:.0f} s to go", flush=True)
        time.sleep(min(30.0, edges[-1] - now))
    for name, proxy in fleet.proxies.items():
        arrivals = list(proxy.arrivals)
        measured.s3[name], measured.queue[name] = [], []
        for start, end in itertools.pairwise(edges):
            kinds = [kind_of(seen, name) for at, seen in arrivals if start <= at < end]
            measured.s3[name].append(Counter(k for k in kinds if k is not None))
            measured.queue[name].append(sum(k is None for k in kinds))


# --- main ----------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--settle", type=float, default=SETTLE, help=f"s after every member serves ({SETTLE:g})"
    )
    parser.add_argument(
        "--window", type=float, default=WINDOW, help=f"s per window (default {WINDOW:g})"
    )
    parser.add_argument(
        "--windows", type=int, default=WINDOWS, help=f"windows, back to back ({WINDOWS})"
    )
    parser.add_argument(
        "--workdir", type=Path, help="a new dir to run in and keep (logs); default: a temp dir"
    )
    parser.add_argument("--write-readme", action="store_true", help="update bench/README.md")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: settle 10 s, 3 windows of 30 s"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.settle, args.window = 10.0, 30.0
    if args.windows < 1 or args.window <= 0 or args.settle < 0:
        parser.error("--windows: at least 1; --window: above 0; --settle: at least 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    began = time.perf_counter()
    load_at_start = os.getloadavg()[0]
    with contextlib.ExitStack() as keep:
        if args.workdir is None:
            root = Path(keep.enter_context(tempfile.TemporaryDirectory(prefix="fleet-idle-")))
        else:
            root = args.workdir
            root.mkdir(parents=True)  # a fresh dir: the daemons' logs stay there
        measured = Measured(
            SETUPS, args.window, BASELINE, SERVED, BEFORE_DEFAULTS, after_defaults()
        )
        with running(root, measured) as fleet:
            measured.machine = fleet.machine
            count_windows(measured, fleet, args)
    measured.machine += (
        f"; load average {load_at_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    )
    print_summary(measured)
    print(f"\n(the whole bench took {time.perf_counter() - began:.0f} s)")
    if args.write_readme:
        write_readme(args, measured)
    return 0


if __name__ == "__main__":
    run_main(main)
