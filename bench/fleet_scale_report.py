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


@dataclass
class FleetResult:
    config: Config
    upkeep_members: int = 0
    minutes: float = 0.0
    fleet: Counter[Kind] = field(default_factory=Counter)  # requests in the window, all members
    upkeep: Counter[Kind] = field(default_factory=Counter)  # by the upkeep_members
    cpu: dict[str, float] = field(default_factory=dict)  # process -> CPU s per minute
    moto_floor: float = 0.0  # moto's CPU s per minute with no member
    done: dict[str, float] = field(default_factory=dict)  # action -> runs / runs due
    late: dict[str, float] = field(default_factory=dict)  # action -> p99 done - due (s)
    problems: Counter[str] = field(default_factory=Counter)  # errors, warnings logged
    changes: list[Change] = field(default_factory=list)
    moto_cpu_per_change: float = 0.0
    failed_changes: int = 0  # the writer's swap() failed
    startup_s: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)  # the host's 1-min load average, window start, end

    def rates(self, role: str) -> dict[Kind, float]:
        """Requests per member per minute by kind: ``fleet`` over all members, ``upkeep``
        over the members that ran it."""
        counts, members = (
            (self.fleet, self.config.members)
            if role == "fleet"
            else (self.upkeep, max(1, self.upkeep_members))
        )
        if not self.minutes:
            return {}
        return {kind: n / members / self.minutes for kind, n in counts.items()}

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
    return sorted(results, key=lambda r: (not r.config.fanout, r.config.members, r.config.models))


# --- tables ------------------------------------------------------------------------------------


def idle_table(results: Sequence[FleetResult]) -> str:
    head = (
        "| fleet (members x models) | **S3 / member / min** | heartbeat PUT | name check GET | "
        "desired state | releases | upkeep (of N) | ratio to the baseline | without the "
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
        {(role, k) for r in results for role in ("fleet", "upkeep") for k in r.rates(role)}
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
        "in time | moto CPU s per change |",
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
        lines.append(
            f"| {r.config.label} | {len(r.changes)}{failed} ({len(r.reads)}) | "
            f"{percentile([c.swap_s for c in r.changes], 50):.2f} | {heard} | "
            f"**{percentile(r.reads, 50):.2f} / {percentile(r.reads, 99):.2f}** | "
            f"{percentile(lasts, 50):.2f} / {max(lasts, default=math.nan):.2f} | "
            f"{sum(c.missing for c in r.changes)} | {r.moto_cpu_per_change:.2f} |"
        )
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
    found: Counter[str] = Counter()
    for r in results:
        found.update(r.problems)
    if not found:
        return "Errors and warnings in the members: none."
    listed = "; ".join(f"{n} x `{text}`" for text, n in found.most_common(6))
    return f"Errors and warnings in the members (all fleets): {listed}."


# --- verdict -----------------------------------------------------------------------------------


def _ratios(pairs: list[tuple[FleetResult, FleetResult]], what: str) -> tuple[str, bool]:
    """Each pair's S3 per member per minute, the second against the first (with the upkeep,
    and without); flat when no ratio is above 1.1."""
    if not pairs:
        return "", True
    found = [
        f"{big.config.members} x {big.config.models} / {small.config.members} x "
        f"{small.config.models}: {big.s3() / small.s3():.2f} "
        f"({big.s3(upkeep=False) / small.s3(upkeep=False):.2f} without the upkeep)"
        for small, big in pairs
    ]
    flat = all(big.s3() / small.s3() <= 1.1 for small, big in pairs)
    return f"in {what} {'; '.join(found)}: **{'flat' if flat else 'not flat'}**", flat


def flatness(results: Sequence[FleetResult], fanout: bool) -> str:
    same = [r for r in ordered(results) if r.config.fanout == fanout and r.minutes]
    by_models: dict[int, list[FleetResult]] = {}
    by_members: dict[int, list[FleetResult]] = {}
    for r in same:  # ordered: fewest members, then fewest models, first
        by_models.setdefault(r.config.models, []).append(r)
        by_members.setdefault(r.config.members, []).append(r)
    in_n = [(rs[0], rs[-1]) for rs in by_models.values() if len(rs) > 1]
    in_m = [(rs[0], rs[-1]) for rs in by_members.values() if len(rs) > 1]
    parts = [text for text, _ in (_ratios(in_n, "N"), _ratios(in_m, "models")) if text]
    if not parts:
        return ""
    return f"{'with the fan-out' if fanout else 'polling'}, {'; '.join(parts)}"


def verdict(results: Sequence[FleetResult]) -> str:
    flat = ". ".join(f for f in (flatness(results, True), flatness(results, False)) if f)
    fanout = [r for r in results if r.config.fanout and r.minutes]
    most = max(fanout, key=lambda r: r.s3(upkeep=False), default=None)
    if most is not None:
        plain, whole = most.s3(upkeep=False), max(r.s3() for r in fanout)
        bound = (
            f"With the fan-out at most 2 S3 requests per member per minute whatever the models "
            f"(issue 23, point 1): without the upkeep **{'met' if plain <= 2 else 'missed'}** "
            f"(at most {plain:.2f}, {most.config.label}), with it "
            f"**{'met' if whole <= 2 else 'missed'}** (at most {whole:.2f})"
        )
    else:
        bound = ""
    top = [r for r in results if r.config.fanout and r.config.members >= 1000]
    if top:
        p99 = max(percentile(r.reads, 99) for r in top)
        met = "met" if p99 < 2.0 else "missed"
        propagation = (
            f"Propagation p99 under 2 s at {top[0].config.members} members with the fan-out: "
            f"**{met}** ({p99:.2f} s)"
        )
    else:
        propagation = "Propagation at 1,000 members: not run"
    return (
        f"Result: idle S3 requests per member, flat in N and in models (a ratio at most 1.1): "
        f"{flat}. {bound}. {propagation}."
    )


# --- the section -----------------------------------------------------------------------------

NOTES = """\
- **A simulation of the store side, not a fleet.** Real: moto's server (S3, SNS and SQS over
  HTTP on loopback, in a process of its own), the daemon's own adapters doing every request
  (`S3Store`, `S3DesiredStates.read_all` / `swap` / `beat` / `beat_of`, `SqsStoreEvents` on a
  `MemberQueue` of each member's own, made and subscribed by the member at start and run under
  the daemon's `Supervisor`; the upkeep is the fleet sync's own `forget_departed`), and the
  S3 -> SNS topic -> one SQS queue per member fan-out, configured as docs/notifications.md says
  (`tests/support/s3.notify_topic`). Not real: no Triton (each member's is a recorder that
  serves whatever release the desired record it read names, and notes when), no daemon
  process (a member is those adapters and a small loop, `bench/fleet_sim.py`), and members
  share processes (up to 250 a process, one boto3 client of each kind per process, calls in a
  thread pool of 32, each long poll in a thread of its own as the adapter does it) and the
  host's 2 CPUs with moto and the proxies.
- **Cadences** (the daemon's defaults, given explicitly): a heartbeat PUT every
  `fleet.keepalive_seconds` (60 s); the heartbeat writer's look at who writes under the
  member's name (a GET) every 6 keepalives; the fleet's upkeep every 300 s (a listing of the
  heartbeats and a GET of each one that changed since the member's last look: every one, since
  each member beats every minute). Without notifications: `read_all()` and a full release scan
  (the models, then each model's releases; the store's one whole-store listing `list_store`
  once it has one) every `store.poll_interval_seconds` (10 s). With the fan-out: `read_all()`
  when the member's queue says the desired state changed, the releases a queue message names
  when one does, and both every `store.full_scan_seconds` (300 s). These are issue 23's
  cadences: the daemon on this branch still reads and lists every poll interval with the
  fan-out too (an event only brings a pass forward).
- **Idle window**: members start (queue made, desired state read, a heartbeat, a full scan),
  then each periodic action keeps the schedule `t0 + phase + k * period`, the phases spread
  evenly over the fleet (as pods started at different times), so a window of a full scan's
  period holds each action exactly once per member and period. Every request is counted at a
  counting proxy in front of moto (the tests' `FaultProxy` with no fault, in its own process),
  by kind from its path, listing prefix or `X-Amz-Target`; the upkeep's requests go through a
  proxy of their own. The upkeep costs a GET per member of the fleet, so it runs on a sample
  (at most 2,000 GETs per period in all: every member of 10, 20 of 100, 2 of 1,000) and is
  reported per member that ran it; moto's CPU leaves the others' upkeep out.
- **Fleets side by side**: each fleet has its own moto, proxies and member processes (counts
  and CPU stay apart); light fleets share the idle window (up to 60 requests/s expected
  from the cadences, together), a fleet of 1,000 runs alone, and propagation is measured one
  fleet at a time with the others paused (their periodic actions; their long polls go on).
- **Propagation**: a change is `swap()` of one model's record through the fleet's first member
  (read, then the conditional PUT), the next model each time; a first change, not counted,
  warms moto's fan-out up (its first delivery to each queue is slow). For every other member:
  the time to its queue's message (fan-out) and to its `read_all()` returning the new
  generation. Between changes 1-2 s. moto's SNS delivers to the queues one after the other
  inside the PutObject that triggers it, so the writer's `swap()` returns only once every
  queue has its message.
- **Machine**: other sessions' test runs shared this host during the run (see the load
  averages below); latencies and CPU are noisy, request counts are not (they follow the
  cadences, as long as the members keep them: "late p99")."""


def section(args: argparse.Namespace, machine: str, results: Sequence[FleetResult]) -> str:
    cad = args.cadences
    flags = "--quick --write-readme" if args.quick else "--write-readme"
    fleets, polling = args.fleets.replace(",", ", "), args.polling_fleets.replace(",", ", ")
    return f"""{BEGIN}
## fleet_scale

Smoke run (~4 min): `.venv/bin/python bench/fleet_scale.py --quick`.

- Measured: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC
- Machine: {machine}
- Parameters: fleets (members x models) {fleets} with the fan-out and {polling} without,
  an idle window of {args.window:g} s, {args.changes} changes of the desired state per fleet
  (`.venv/bin/python bench/fleet_scale.py {flags}`)
{NOTES}

{verdict(results)}

Idle, per member per minute (S3 counts include the upkeep, counted per member that ran it;
the baseline is the smallest fleet with the fewest models of the same mode, in the same run;
"late p99": the worst, over the periodic actions but the upkeep, of the 99th percentile of how
long after its due time an action was done (a few seconds or more: the members could not keep
their cadence, and the counts fall short); prices: S3 Standard us-east-1 list prices as of
{PRICES_AS_OF}; poll {cad.poll:g} s, keepalive {cad.keepalive:g} s, full scan and upkeep
{cad.full_scan:g} s):

{idle_table(results)}

Propagation (from the start of the writer's `swap()` to each other member's `read_all()`
returning the new generation; every member of every change is a sample):

{propagation_table(results)}

{cpu_line(results)} {problems_line(results)}

<details><summary>Every kind of request, per member per minute</summary>

{kinds_table(results)}

</details>
{END}"""


def write_readme(text: str) -> None:
    write_section(text, begin=BEGIN, end=END, script="fleet_scale.py", row=INTRO_ROW)
