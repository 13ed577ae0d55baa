"""The fleet scale bench's results, tables, verdict and section of bench/README.md.

Kept apart from the measuring, as the other benches' reports are. It writes only between its
own markers, plus its one row in the README's intro table. Prices are the fleet bench's
(:mod:`bench.fleet_report`), with the date they were written down.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from bench.fleet_report import PRICES_AS_OF, monthly
from bench.report import write_section
from bench.store_counter import Kind

BEGIN, END = "<!-- fleet_scale:begin -->", "<!-- fleet_scale:end -->"
INTRO_ROW = (
    "| `fleet_scale.py` | a simulation of the store side of fleets of 10, 100 and 1,000 members "
    "(the daemon's real S3, SNS and SQS adapters at the daemon's cadences, each member's Triton "
    "replaced by a recorder; moto's server over HTTP, members sharing processes), 1 and 20 "
    "models, the fan-out on and off: idle S3 and SQS requests per member per minute by kind "
    "(through counting proxies) against the fleet of 10 with one model, moto's CPU, and the "
    "time from a change of the desired state to the last member having read it (p50, p99) |"
)
MEMBERS_PRICED = 1000
PROCESSES = ("moto", "proxies", "members")
DESIRED = ("desired", "generations.json")  # what a desired-state read asks for
RELEASES = ("models", "releases", "whole store", "release files")


@dataclass(frozen=True)
class Config:
    members: int
    models: int
    fanout: bool

    @property
    def label(self) -> str:
        return f"{self.members} x {self.models}, {'fan-out' if self.fanout else 'polling'}"


@dataclass
class Change:
    swap_s: float  # the swap() itself
    reads: list[float]  # swap start -> each other member's read_all() had it (s)
    heard: list[float]  # swap start -> each member's queue said so (fan-out)
    missing: int  # members that had not read it by the deadline
    spread_s: float  # swap start -> the last read (or the deadline)
    cpu: dict[str, float]  # CPU s meanwhile, by process (moto, proxies, members)


@dataclass
class FleetResult:
    config: Config
    upkeep_members: int = 0  # the sample of members that ran the upkeep
    upkeep_runs: int = 0  # its runs in the window
    upkeep_period: float = 900.0  # s between two runs of one member
    minutes: float = 0.0
    fleet: Counter[Kind] = field(default_factory=Counter)  # requests in the window, all members
    upkeep: Counter[Kind] = field(default_factory=Counter)  # by the upkeep_members
    cpu: dict[str, float] = field(default_factory=dict)  # process -> CPU s per minute
    moto_floor: float = 0.0  # moto's CPU s per minute with no member
    done: dict[str, float] = field(default_factory=dict)  # action -> runs / runs due
    late: dict[str, float] = field(default_factory=dict)  # action -> p99 done - due (s)
    problems: Counter[str] = field(default_factory=Counter)  # errors, warnings logged
    changes: list[Change] = field(default_factory=list)
    failed_changes: int = 0  # the writer's swap() failed
    startup_s: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)  # the host's 1-min load average, window start, end
    # (phase, "moto" or "proxy") -> s a GET of the probe's object took (bench.fleet_scale.Probe)
    probe: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    not_started: str | None = None  # why the fleet was not measured: its members did not start

    def rates(self, role: str) -> dict[Kind, float]:
        """Requests per member per minute by kind: ``fleet`` over all members in the window,
        ``upkeep`` as what one run asked (over the sample's runs in the window) once every
        upkeep period."""
        if not self.minutes:
            return {}
        if role == "fleet":
            return {k: n / self.config.members / self.minutes for k, n in self.fleet.items()}
        if not self.upkeep_runs:
            return {}
        per_minute = 60.0 / self.upkeep_period
        return {k: n / self.upkeep_runs * per_minute for k, n in self.upkeep.items()}

    def s3(self, *, upkeep: bool = True) -> float:
        total = sum(v for k, v in self.rates("fleet").items() if k[0] == "S3")
        return total + (self.group("S3", "upkeep") if upkeep else 0.0)

    def group(self, api: str, name: str) -> float:
        """Per member per minute of one column of the idle table."""
        fleet, upkeep = self.rates("fleet"), self.rates("upkeep")
        if name == "upkeep":
            return sum(v for k, v in upkeep.items() if k[0] == api)
        whats = {
            "beat": ("heartbeat",),
            "name check": ("heartbeats",),
            "desired": DESIRED,
            "releases": RELEASES,
        }.get(name)
        return sum(
            v for k, v in fleet.items() if k[0] == api and (whats is None or k[1] in whats)
        )  # whats None: the whole API

    def cost(self) -> float:
        """$ per month of MEMBERS_PRICED members' idle S3 requests at list prices."""
        rates: dict[str, float] = {}
        for role in ("fleet", "upkeep"):
            for (api, _what, method), v in self.rates(role).items():
                if api == "S3":
                    rates[method] = rates.get(method, 0.0) + v
        return sum(monthly(v, method, MEMBERS_PRICED) for method, v in rates.items())

    def busy(self) -> dict[str, float]:
        """CPU cores each process kept busy while the changes spread (their CPU s over
        the time from each swap's start to the last member's read, added up)."""
        wall = sum(c.spread_s for c in self.changes)
        roles = sorted({role for c in self.changes for role in c.cpu})
        return (
            {r: sum(c.cpu.get(r, 0.0) for c in self.changes) / wall for r in roles} if wall else {}
        )

    @property
    def reads(self) -> list[float]:
        return [r for c in self.changes for r in c.reads]

    @property
    def heard(self) -> list[float]:
        return [r for c in self.changes for r in c.heard]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank); NaN for no values."""
    if not values:
        return math.nan
    ranked = sorted(values)
    return ranked[min(len(ranked) - 1, max(0, math.ceil(q / 100 * len(ranked)) - 1))]


def baseline(results: Sequence[FleetResult], fanout: bool) -> FleetResult | None:
    """The smallest fleet with the fewest models of the same mode, in the same run."""
    same = [r for r in results if r.config.fanout == fanout and r.minutes]
    return min(same, key=lambda r: (r.config.members, r.config.models), default=None)


def ordered(results: Sequence[FleetResult]) -> list[FleetResult]:
    """The fleets that were measured, with the fan-out first, then by size."""
    return sorted(
        (r for r in results if r.not_started is None),
        key=lambda r: (not r.config.fanout, r.config.members, r.config.models),
    )


def not_started_line(results: Sequence[FleetResult]) -> str:
    """The fleets that could not be measured, each with its answer times while it started."""
    found = [
        f"**{r.config.label}**: {r.not_started}; moto's answer to the bench's GET meanwhile, "
        f"p50 / p99 (s), straight {_answers(r.probe.get(('start', 'moto'), []))}, through "
        f"the proxy {_answers(r.probe.get(('start', 'proxy'), []))}"
        for r in results
        if r.not_started is not None
    ]
    if not found:
        return ""
    return "Fleets not measured (their members did not start): " + "; ".join(found) + "."


# --- tables ------------------------------------------------------------------------------------


def idle_table(results: Sequence[FleetResult]) -> str:
    head = (
        "| fleet (members x models) | **S3 / member / min** | heartbeat PUT | name check GET | "
        "desired state | releases | upkeep (sample) | ratio to the baseline | without the "
        "upkeep | its ratio | SQS / member / min | $ / month, 1,000 members | moto CPU s/min "
        "(alone) | late p99 (s) |"
    )
    lines = [head, "|---|" + "---:|" * 13]
    for r in ordered(results):
        base = baseline(results, r.config.fanout)
        ratio = r.s3() / base.s3() if base and base.s3() else math.nan
        plain = r.s3(upkeep=False) / base.s3(upkeep=False) if base else math.nan
        late = max((v for a, v in r.late.items() if a != "upkeep"), default=math.nan)
        lines.append(
            f"| {r.config.label} | **{r.s3():.2f}** | {r.group('S3', 'beat'):.2f} | "
            f"{r.group('S3', 'name check'):.2f} | {r.group('S3', 'desired'):.2f} | "
            f"{r.group('S3', 'releases'):.2f} | {r.group('S3', 'upkeep'):.2f} "
            f"({r.upkeep_members}) | {ratio:.2f} | {r.s3(upkeep=False):.2f} | {plain:.2f} | "
            f"{r.group('SQS', 'all'):.2f} | {r.cost():,.0f} | {r.cpu.get('moto', 0):.2f} "
            f"({r.moto_floor:.2f}) | {late:.2f} |"
        )
    return "\n".join(lines)


def kinds_table(results: Sequence[FleetResult]) -> str:
    """Every kind of request, per member per minute, each fleet a column."""
    results = ordered(results)
    kinds = sorted(
        {
            (role, k)
            for r in results
            for role in ("fleet", "upkeep")
            for k in r.rates(role)
            if k[0] != "bench"  # the bench's own probe
        }
    )
    lines = [
        "| request (API, what, method) | " + " | ".join(r.config.label for r in results) + " |",
        "|---|" + "---:|" * len(results),
    ]
    for role, kind in kinds:
        cells = [f"{r.rates(role).get(kind, 0.0):.2f}" for r in results]
        label = " ".join(kind) + (" (upkeep, per member that ran it)" if role == "upkeep" else "")
        lines.append(f"| {label} | {' | '.join(cells)} |")
    return "\n".join(lines)


def propagation_table(results: Sequence[FleetResult]) -> str:
    lines = [
        "| fleet | changes (samples) | swap() p50 (s) | queue said so p50 / p99 (s) | "
        "**read p50 / p99 (s)** | last member per change, median / max (s) | not read "
        "in time | CPU busy while it spread (cores): moto / proxies / members |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in ordered(results):
        lasts = [max(c.reads) for c in r.changes if c.reads]
        heard = (
            f"{percentile(r.heard, 50):.2f} / {percentile(r.heard, 99):.2f}"
            if r.config.fanout
            else "-"
        )
        failed = f" ({r.failed_changes} failed)" if r.failed_changes else ""
        cores = r.busy()
        busy = " / ".join(f"{cores.get(role, math.nan):.2f}" for role in PROCESSES)
        lines.append(
            f"| {r.config.label} | {len(r.changes)}{failed} ({len(r.reads)}) | "
            f"{percentile([c.swap_s for c in r.changes], 50):.2f} | {heard} | "
            f"**{percentile(r.reads, 50):.2f} / {percentile(r.reads, 99):.2f}** | "
            f"{percentile(lasts, 50):.2f} / {max(lasts, default=math.nan):.2f} | "
            f"{sum(c.missing for c in r.changes)} | {busy} |"
        )
    return "\n".join(lines)


def _answers(values: Sequence[float]) -> str:
    if not values:
        return "-"
    late = sum(1 for v in values if math.isinf(v))
    shown = f"{percentile(values, 50):.3f} / {percentile(values, 99):.3f}"
    return shown + (f" ({late} timed out)" if late else "")


def probe_table(results: Sequence[FleetResult]) -> str:
    """moto's answer time to the bench's own GET, straight and through the proxy."""
    lines = [
        "| fleet | start: moto; through the proxy, p50 / p99 (s) | idle: moto; through the "
        "proxy | while changes spread: moto; through the proxy | samples |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in ordered(results):
        cells = [
            f"{_answers(r.probe.get((phase, 'moto'), []))}; "
            f"{_answers(r.probe.get((phase, 'proxy'), []))}"
            for phase in ("start", "idle", "spread")
        ]
        samples = sum(len(v) for v in r.probe.values())
        lines.append(f"| {r.config.label} | {' | '.join(cells)} | {samples} |")
    return "\n".join(lines)


def cpu_line(results: Sequence[FleetResult]) -> str:
    parts = [
        f"{r.config.label}: moto {r.cpu.get('moto', 0):.1f}, proxies "
        f"{r.cpu.get('proxies', 0):.1f}, members {r.cpu.get('members', 0):.1f} (start-up "
        f"{r.startup_s:.0f} s, load {r.load[0]:.1f} -> {r.load[1]:.1f})"
        for r in ordered(results)
    ]
    return "CPU s per minute in the idle window, by process: " + "; ".join(parts) + "."


def problems_line(results: Sequence[FleetResult]) -> str:
    """Errors and warnings in the members, by fleet: the most frequent kinds, each with its
    first message."""
    parts = [
        f"{r.config.label}: "
        + "; ".join(f"{n} x `{text}`" for text, n in r.problems.most_common(4))
        for r in ordered(results)
        if r.problems
    ]
    if not parts:
        return "Errors and warnings in the members: none."
    return "Errors and warnings in the members (by fleet, the commonest): " + ". ".join(parts) + "."


# --- verdict -----------------------------------------------------------------------------------


FLAT = 1.1  # a ratio to the smallest fleet at most this: flat
# An idle member's S3 requests per minute measured with a real daemon and Triton by
# bench/fleet_idle.py (bench/README.md, 2026-12-06 03:17 UTC), alone in its fleet: fan-out /
# polling -> models -> requests. Its upkeep there: a listing and one GET every 900 s.
FLEET_IDLE = {True: {1: 1.87, 20: 1.87}, False: {1: 13.40, 20: 13.33}}
ALONE_UPKEEP = 2 * 60 / 900


def _pairs(results: Sequence[FleetResult], by: str) -> list[tuple[FleetResult, FleetResult]]:
    """(smallest, largest) of the fleets of each mode that differ only in ``by`` ("N" or
    "models")."""
    groups: dict[tuple[bool, int], list[FleetResult]] = {}
    for r in ordered(results):  # fewest members, then fewest models, first
        if r.minutes:
            fixed = r.config.models if by == "N" else r.config.members
            groups.setdefault((r.config.fanout, fixed), []).append(r)
    return [(rs[0], rs[-1]) for rs in groups.values() if len(rs) > 1]


def _flat(pairs: Sequence[tuple[FleetResult, FleetResult]], *, upkeep: bool) -> bool:
    return all(big.s3(upkeep=upkeep) / small.s3(upkeep=upkeep) <= FLAT for small, big in pairs)


def flatness(results: Sequence[FleetResult]) -> str:
    """The target: idle S3 requests per member flat in N and in the number of models."""
    found = []
    for by in ("N", "models"):
        pairs = _pairs(results, by)
        if not pairs:
            continue
        whole, plain = _flat(pairs, upkeep=True), _flat(pairs, upkeep=False)
        ratios = "; ".join(
            f"{big.config.label} / {small.config.label}: {big.s3() / small.s3():.2f} "
            f"({big.s3(upkeep=False) / small.s3(upkeep=False):.2f} without the upkeep)"
            for small, big in pairs
        )
        why = " (the upkeep alone grows: met without it)" if plain and not whole else ""
        found.append(f"in {by} **{'met' if whole else 'missed'}**{why} ({ratios})")
    return "; ".join(found) if found else "not run (one fleet of each mode)"


def verdict(results: Sequence[FleetResult]) -> str:
    flat = flatness(results)
    fanout = [r for r in results if r.config.fanout and r.minutes]
    most = max(fanout, key=lambda r: r.s3(upkeep=False), default=None)
    if most is not None:
        plain = most.s3(upkeep=False)
        whole = max(fanout, key=lambda r: r.s3())
        bound = (
            f"With the fan-out at most 2 S3 requests per member per minute whatever the models "
            f"(issue 23, point 1; fleet_idle measures it with a real daemon): without the "
            f"upkeep **{'met' if plain <= 2 else 'missed'}** (at most {plain:.2f}, "
            f"{most.config.label}), with it **{'met' if whole.s3() <= 2 else 'missed'}** (at "
            f"most {whole.s3():.2f}, {whole.config.label})"
        )
    else:
        bound = "With the fan-out: not run"
    top = [r for r in ordered(results) if r.config.fanout and r.config.members >= 1000]
    unmeasured = [
        r.config.label
        for r in results
        if r.not_started is not None and r.config.fanout and r.config.members >= 1000
    ]
    if unmeasured:
        propagation = (
            "Propagation p99 under 2 s at 1,000 members with the fan-out: **missed**: not "
            f"measured, {', '.join(unmeasured)} did not start on this host (below)"
        )
    elif top:
        found = [
            f"{r.config.label} {percentile(r.reads, 99):.2f} s (its queue said so: p99 "
            f"{percentile(r.heard, 99):.2f} s; the writer's swap() p50 "
            f"{percentile([c.swap_s for c in r.changes], 50):.2f} s)"
            for r in top
        ]
        met = all(percentile(r.reads, 99) < 2.0 for r in top)
        propagation = (
            f"Propagation p99 under 2 s at 1,000 members with the fan-out: "
            f"**{'met' if met else 'missed'}** ({'; '.join(found)})"
        )
    else:
        propagation = "Propagation at 1,000 members: not run"
    return (
        f"Result: idle S3 requests per member flat in N and in the number of models (a ratio "
        f"to the smaller fleet at most {FLAT}): {flat}. {bound}. {propagation}."
    )


def agreement(results: Sequence[FleetResult]) -> str:
    """The smallest fleets against bench/fleet_idle.py's real daemon, alone in its fleet."""
    found = []
    for r in ordered(results):
        if r.config.members != min(x.config.members for x in results) or not r.minutes:
            continue
        real = FLEET_IDLE[r.config.fanout].get(r.config.models)
        if real is None:
            continue
        sim = r.s3(upkeep=False) + ALONE_UPKEEP
        found.append(f"{r.config.label}: {sim:.2f} here, {real:.2f} there ({sim - real:+.2f})")
    if not found:
        return ""
    return (
        "Against a real daemon (`fleet_idle.py` above: a daemon and its Triton, alone in its "
        "fleet, so its upkeep is a listing and one GET every 900 s, "
        f"{ALONE_UPKEEP:.2f} a minute), the smallest fleets here without the upkeep plus "
        f"that: {'; '.join(found)}."
    )


# --- the section -----------------------------------------------------------------------------

NOTES = """\
- **A simulation of the store side, not a fleet.** Real: moto's server (S3, SNS and SQS over
  HTTP on loopback, in a process of its own), the daemon's own adapters doing every request
  (`S3Store.list_store`, `S3DesiredStates.read_all` / `swap` / `beat` / `beat_of`,
  `SqsStoreEvents` on a `MemberQueue` of each member's own, made and subscribed by the member
  at start and run under the daemon's `Supervisor`, `take()` / `handled()` as the release
  watcher calls them; the upkeep is the fleet sync's own `forget_departed`), and the S3 -> SNS
  topic -> one SQS queue per member fan-out, configured as docs/notifications.md says
  (`tests/support/s3.notify_topic`). Not real: no Triton (each member's is a recorder that
  serves whatever release the desired record it read names, at once, and notes when), no
  daemon process (a member is those adapters and a small loop, `bench/fleet_sim.py`), and
  members share processes (up to 250 a process, one boto3 client of each kind per process,
  calls in a thread pool of 32, each long poll in a thread of its own as the adapter does it)
  and the host's 2 CPUs with moto and the proxies.
- **Cadences**, the daemon's defaults, each action on the adapter call the daemon's loop makes
  (`fleet_sync.py`, `heartbeat.py`, `fleet_upkeep.py`, `watcher.py`): a heartbeat PUT every
  `fleet.keepalive_seconds` (60 s), and one at once when what the member serves changed (after
  a change it read); before a beat every 6 keepalives (360 s), the GET of the member's own
  heartbeat (the name check); every 900 s the fleet's upkeep (`forget_departed`: a listing
  of the heartbeats and a GET of each one whose ETag changed since the member's last look:
  every one, since each member beats every minute). Polling: `read_all()` every
  `store.poll_interval_seconds` (10 s; a GET of the generations index with `If-None-Match`,
  a 304 while nothing changed, and a listing of the records once a full scan's period has
  passed) and a full scan of the releases (`list_store`: one paginated listing of the whole
  store) every 10 s. With the fan-out: the sync's passes in between read nothing (the
  member's own queue vouches), `read_all(named)` when the queue says a desired record changed
  (the index and the records it names) and every `store.full_scan_seconds` (300 s; then a
  listing of the records too, as the daemon's check finds it due); the releases a queue
  message names, and the whole store every 300 s; SQS long polls of 20 s.
- **Idle window**: members start (queue made, desired state read, a heartbeat, a full scan),
  then each periodic action keeps the schedule `t0 + phase + k * period`, the phases spread
  evenly over the fleet (as pods started at different times), so a window of a full scan's
  period holds each action exactly once per member and period. (At `t0` the records'
  adapter's clock is moved on a full scan's period, as if the member had been up that long:
  else its first reads would find the start's listing too recent and skip theirs.) Every
  request is counted at a counting proxy in front of moto (the tests' `FaultProxy` with no
  fault, in its own process), by kind from its path, listing prefix or `X-Amz-Target`.
- **The upkeep** costs a GET per member of the fleet, so it runs on a sample (at most 2,000
  GETs in the window in all: every member of 10, 20 of 100, 2 of 1,000), whose runs are put
  inside the window and counted at a proxy of their own; per member per minute is what one
  run asked, once every 900 s. moto's CPU in the window has the sample's upkeep only: the
  whole fleet's, at 1,000 members, would be over 1,000 GETs a second.
- **Fleets side by side**: each fleet has its own moto, proxies and member processes (counts
  and CPU stay apart); light fleets share the idle window (up to 40 requests/s expected
  from the cadences, together), a fleet of 1,000 runs alone, and propagation is measured one
  fleet at a time with the others paused (their periodic actions; their long polls go on).
- **Propagation**: a change is `swap()` of one model's record through the fleet's first member
  (read, then the conditional PUT and the index's), the next model each time; a first change,
  not counted, warms moto's fan-out up (its first delivery to each queue is slow). For every
  other member: the time to its queue's message (fan-out) and to its `read_all()` returning
  the new generation (then it beats, as the daemon does when what it serves changes). Between
  changes 1-2 s. moto's S3 publishes to SNS, and SNS delivers to each queue, one queue after
  the other inside the PutObject that triggers it, so the writer's `swap()` returns only once
  every queue has its message: "queue said so" grows with N on moto, where AWS delivers
  asynchronously. CPU busy: each process's CPU seconds from a swap's start to the last
  member's read, over that time (2 cores in all on this host).
- **Machine**: other sessions' test runs shared this host during the run (see the load
  averages below); latencies and CPU are noisy, request counts are not (they follow the
  cadences, as long as the members keep them: "late p99")."""


def section(args: argparse.Namespace, machine: str, results: Sequence[FleetResult]) -> str:
    cad = args.cadences
    fleets, polling = args.fleets.replace(",", ", "), args.polling_fleets.replace(",", ", ")
    return f"""{BEGIN}
## fleet_scale

Smoke run (~4 min): `.venv/bin/python bench/fleet_scale.py --quick`.

- Measured: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC
- Machine: {machine}
- Parameters: fleets (members x models) {fleets} with the fan-out and {polling} without,
  an idle window of {args.window:g} s, {args.changes} changes of the desired state per fleet
  (`.venv/bin/python bench/fleet_scale.py {args.command}`)
{NOTES}

{verdict(results)}

{not_started_line(results)}

Idle, per member per minute (S3 counts include the upkeep, what one run of the sample asked
once every {cad.upkeep:g} s;
the baseline is the smallest fleet with the fewest models of the same mode, in the same run;
"late p99": the worst, over the periodic actions but the upkeep, of the 99th percentile of how
long after its due time an action was done (a few seconds or more: the members could not keep
their cadence, and the counts fall short); prices: S3 Standard us-east-1 list prices as of
{PRICES_AS_OF}; poll {cad.poll:g} s, keepalive {cad.keepalive:g} s, name check
{cad.name_check:g} s, full scan {cad.full_scan:g} s):

{idle_table(results)}

{agreement(results)}

Propagation (from the start of the writer's `swap()` to each other member's `read_all()`
returning the new generation; every member of every change is a sample):

{propagation_table(results)}

moto's answer time: every 2 s the bench GETs a small object of its own, straight from moto
and through the fleet's counting proxy (counted apart), from the bench's process (what it
shows is moto's and the proxy's time, not the members'; a timeout is 120 s):

{probe_table(results)}

{cpu_line(results)} {problems_line(results)}

<details><summary>Every kind of request, per member per minute</summary>

{kinds_table(results)}

</details>
{END}"""


def write_readme(text: str) -> None:
    write_section(text, begin=BEGIN, end=END, script="fleet_scale.py", row=INTRO_ROW)
