"""What an idle fleet asks of its store, per member per minute, and what that costs on S3.

Nothing changes while this counts: the members serve r0 of one model and the store holds r0
and r1. Each member reads the desired state every ``store.poll_interval_seconds`` (a listing of
``_controlplane/desired/`` and a GET per model), writes its heartbeat every
``fleet.keepalive_seconds`` (one PUT), and its release watcher lists the store every poll
interval (the models, then each model's objects). Both intervals are the defaults here (10 s
and 5 s), set explicitly because the tests' ``Fleet`` would set 1 s.

* S3: moto's server (in a process of its own) with one counting proxy per member (the tests'
  :class:`~tests.support.fault_proxy.FaultProxy`, no fault scripted, noting when each request
  came), so each member's requests are counted apart and by purpose from their path and query.
* A directory store: ``strace -f`` attached to each member's daemon for the same window, every
  file-system call whose path is under the store counted by purpose (opens, directory reads,
  stats, renames and fsyncs: on NFS each is a round trip or a lookup the server answers).

A member's window runs from one of its desired-state listings to its last one in the window,
so it holds whole poll cycles; per minute is counted over that span. Before the window, one
rollout (r1 through one member, ``fleet: true``) is counted too: what a deploy costs besides
the release's own download.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from bench.fleet_members import Tritons, deployed, intervals, log_problems, wait_ready
from bench.report import machine
from bench.s3_download import moto_process
from tests.support.fault_proxy import FaultKind, FaultProxy, SeenRequest
from tests.support.fleet import Fleet, Member
from tests.support.models import write_scale_release
from tests.support.s3 import aws_env, s3_client, upload_release_dir

MODEL = "idle"
BUCKET, PREFIX = "fleet-bench", "models"
# store.poll_interval_seconds (its default) and fleet.keepalive_seconds (5 s, its default
# when this was measured; 60 s since)
POLL, BEAT = 10.0, 5.0
PURPOSES = ("desired", "heartbeats", "releases", "release files", "other")
# Path-based calls strace reports with the store's path (fd arguments through -y).
SYSCALLS = (
    "openat,getdents64,newfstatat,statx,stat,lstat,access,readlink,"
    "rename,renameat,renameat2,unlink,unlinkat,mkdir,mkdirat,fsync,fdatasync"
)
SYSCALL_KIND = {
    "openat": "open",
    "getdents64": "readdir",
    "rename": "write",
    "renameat": "write",
    "renameat2": "write",
    "unlink": "write",
    "unlinkat": "write",
    "mkdir": "write",
    "mkdirat": "write",
    "fsync": "write",
    "fdatasync": "write",
}  # every other traced call is a stat


@dataclass
class IdleCounts:
    """Requests (S3) and file-system calls (directory store) per member per minute."""

    machine: str = ""
    s3: dict[tuple[str, str], float] = field(default_factory=dict)  # (purpose, method)
    s3_minutes: float = 0.0  # the members' windows, summed
    s3_members: int = 0
    rollout: dict[tuple[str, str], float] = field(default_factory=dict)  # totals, all members
    rollout_s: float = 0.0
    rollout_members: int = 0
    local: dict[tuple[str, str], float] = field(default_factory=dict)  # (purpose, kind)
    local_minutes: float = 0.0
    local_note: str = ""
    problems: Counter[str] = field(default_factory=Counter)  # the daemons' warnings, errors

    def summary(self) -> str:
        s3 = sum(self.s3.values())
        local = sum(self.local.values())
        return (
            f"idle store traffic per member per minute (poll {POLL:g} s, heartbeat {BEAT:g} s): "
            f"S3 {s3:.1f} requests ({fmt(self.s3)}); directory store {local:.1f} calls "
            f"({fmt(self.local)}){' ' + self.local_note if self.local_note else ''}"
        )


def fmt(counts: dict[tuple[str, str], float]) -> str:
    return ", ".join(f"{p} {k} {v:.1f}" for (p, k), v in sorted(counts.items()))


# --- S3: counting requests -----------------------------------------------------------------


class CountingProxy(FaultProxy):
    """The tests' fault proxy with no fault scripted, noting when each request came."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.arrivals: list[tuple[float, SeenRequest]] = []

    def _record(self, seen: SeenRequest) -> FaultKind | None:
        self.arrivals.append((time.perf_counter(), seen))  # list.append holds the GIL
        return super()._record(seen)


def s3_purpose(seen: SeenRequest) -> tuple[str, str]:
    """(purpose, method) of one request: ListObjectsV2 is a GET with ``list-type=2``."""
    query = parse_qs(seen.query)
    listing = seen.method == "GET" and query.get("list-type") == ["2"]
    key = (query.get("prefix") or [""])[0] if listing else seen.path.split("/", 2)[-1]
    method = "LIST" if listing else seen.method
    records = f"{PREFIX}/_controlplane/"
    if key.startswith(records + "desired/"):
        return "desired", method
    if key.startswith(records + "members/"):
        return "heartbeats", method
    if key.startswith(records):
        return "other", method  # the conditional-write probe
    if listing:
        return "releases", method
    return "release files", method


def per_cycle(
    events: Sequence[tuple[float, tuple[str, str]]], start: float, end: float
) -> tuple[Counter[tuple[str, str]], float]:
    """Counts in whole poll cycles of ``[start, end]`` and the span they cover, in minutes.

    A cycle starts at a desired-state listing; with fewer than two in the window, the whole
    window counts."""
    marks = [at for at, what in events if what[0] == "desired" and what[1] in ("LIST", "opendir")]
    marks = [at for at in marks if start <= at <= end]
    if len(marks) >= 2:
        start, end = marks[0], marks[-1]
    found = Counter(what for at, what in events if start <= at < end)
    return found, (end - start) / 60.0


# --- a directory store: strace -----------------------------------------------------------

_LINE = re.compile(r"^\d+\s+(\d\d):(\d\d):(\d\d\.\d+)\s+(?:<\.\.\. )?(\w+)\(")


@contextlib.contextmanager
def traced(pid: int, out: Path) -> Iterator[subprocess.Popen[bytes]]:
    """strace attached to every thread of ``pid`` until the block ends (then detached)."""
    command = ["strace", "-f", "-qq", "-tt", "-y", "-e", f"trace={SYSCALLS}", "-o", str(out)]
    tracer = subprocess.Popen([*command, "-p", str(pid)], stderr=subprocess.PIPE)
    try:
        time.sleep(1.0)  # attached to every thread, or failed
        if tracer.poll() is not None:
            error = tracer.stderr.read().decode(errors="replace") if tracer.stderr else ""
            raise RuntimeError(f"strace could not attach to {pid}: {error.strip()}")
        yield tracer
    finally:
        if tracer.poll() is None:
            tracer.send_signal(signal.SIGINT)  # detaches, the daemon runs on
            try:
                tracer.wait(timeout=10)
            except subprocess.TimeoutExpired:
                tracer.kill()
                tracer.wait()
        if tracer.stderr is not None:
            tracer.stderr.close()


def local_events(trace: Path, store: Path) -> list[tuple[float, tuple[str, str]]]:
    """(perf_counter time, (purpose, kind)) of each traced call on ``store``."""
    offset = time.time() - time.perf_counter()
    today = datetime.now().astimezone().replace(hour=0, minute=0, second=0, microsecond=0)
    midnight = today.timestamp()
    root = str(store)
    events = []
    for line in trace.read_text(errors="replace").splitlines():
        found = _LINE.match(line)
        if found is None or "resumed>" in line or root not in line:
            continue
        hours, minutes, seconds, call = found.groups()
        wall = midnight + int(hours) * 3600 + int(minutes) * 60 + float(seconds)
        records = f"{root}/_controlplane/"
        if records + "desired" in line:
            purpose = "desired"
        elif records + "members" in line:
            purpose = "heartbeats"
        elif records in line:
            purpose = "other"
        else:
            purpose = "releases"
        kind = SYSCALL_KIND.get(call, "stat")
        if call == "openat" and "O_DIRECTORY" in line:
            kind = "opendir"
        events.append((wall - offset, (purpose, kind)))
    return events


# --- the measurement -----------------------------------------------------------------------


def _publish(root: Path, client: Any) -> Path:
    """r0 and r1 in the bucket and in a directory store; the directory store's root."""
    local = root / "local-store"
    for release, k in (("r0", 1.0), ("r1", 2.0)):
        write_scale_release(local, MODEL, release, k=k)
        upload_release_dir(client, BUCKET, PREFIX, local / MODEL / release)
    return local


def _rollout_counts(
    proxies: Sequence[CountingProxy], leader: Member
) -> tuple[dict[tuple[str, str], float], float]:
    """Every member's requests, by purpose, while one rollout runs (the call to its answer)."""
    begin = time.perf_counter()
    deployed(leader, MODEL, "r1")
    end = time.perf_counter()
    found: Counter[tuple[str, str]] = Counter()
    for proxy in proxies:
        found.update(s3_purpose(seen) for at, seen in list(proxy.arrivals) if begin <= at <= end)
    return {key: float(n) for key, n in found.items()}, end - begin


def idle_store_traffic(
    root: Path, seconds: float, *, members: int = 2, rollout: bool = True
) -> IdleCounts:
    """An S3 fleet and a directory-store fleet of ``members`` each, idle for ``seconds``;
    with ``rollout``, one rollout on the S3 fleet is counted first."""
    counts = IdleCounts(s3_members=members)
    root.mkdir(parents=True)
    with contextlib.ExitStack() as stack:
        endpoint = stack.enter_context(moto_process(root / "moto.log"))
        client = s3_client(endpoint)
        stack.callback(client.close)
        client.create_bucket(Bucket=BUCKET)
        local_store = _publish(root, client)
        tritons = Tritons()
        stack.callback(tritons.stop)  # last: after every daemon has stopped
        proxies = [CountingProxy(endpoint) for _ in range(members)]
        for proxy in proxies:
            stack.enter_context(proxy)
        env = intervals(POLL, BEAT)
        s3 = Fleet(
            store=root / "unused",
            tritons=tritons,
            root=root / "s3",
            model=MODEL,
            store_uri=f"s3://{BUCKET}/{PREFIX}",
            env=env,
        )
        local = Fleet(store=local_store, tritons=tritons, root=root / "local", model=MODEL, env=env)
        # Runs after both fleets stopped (callbacks run last first): their logs are complete.
        stack.callback(lambda: counts.problems.update(log_problems([*s3.members, *local.members])))
        stack.callback(s3.stop)
        stack.callback(local.stop)
        for proxy in proxies:
            s3.add(wait_ready=False, extra_env=aws_env(proxy.endpoint))
        for _ in range(members):
            local.add(wait_ready=False)
        wait_ready([*s3.members, *local.members], timeout=300)
        counts.machine = machine(s3.members[0].triton)
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda f: deployed(f.members[0], MODEL, "r0"), (s3, local)))
        if rollout:
            counts.rollout, counts.rollout_s = _rollout_counts(proxies, s3.members[-1])
            counts.rollout_members = members
        _idle_window(counts, proxies, local, local_store, root, seconds)
    return counts


def _idle_window(
    counts: IdleCounts,
    proxies: Sequence[CountingProxy],
    local: Fleet,
    local_store: Path,
    root: Path,
    seconds: float,
) -> None:
    """Count ``seconds`` of nothing happening: every S3 request, every traced call."""
    traces = [root / f"strace-{m.name}.txt" for m in local.members]
    with contextlib.ExitStack() as stack:
        if shutil.which("strace") is None:
            counts.local_note = "(strace is not installed: no directory-store counts)"
        else:
            for member, out in zip(local.members, traces, strict=True):
                stack.enter_context(traced(member.api.process.pid, out))
        begin = time.perf_counter()
        time.sleep(seconds)
        end = time.perf_counter()
    s3_total: Counter[tuple[str, str]] = Counter()
    for proxy in proxies:
        events = [(at, s3_purpose(seen)) for at, seen in list(proxy.arrivals)]
        found, minutes = per_cycle(events, begin, end)
        s3_total.update(found)
        counts.s3_minutes += minutes
    counts.s3 = {key: n / counts.s3_minutes for key, n in s3_total.items()}
    if counts.local_note:
        return
    local_total: Counter[tuple[str, str]] = Counter()
    for out in traces:
        found, minutes = per_cycle(local_events(out, local_store), begin, end)
        local_total.update(found)
        counts.local_minutes += minutes
    counts.local = {key: n / counts.local_minutes for key, n in local_total.items()}
