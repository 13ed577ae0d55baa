"""The idle-cost bench's report: requests per member per minute by kind, the monthly bill of
100 and 1,000 members, the verdict against issue 23's targets, its section of bench/README.md.

Kept apart from the measuring, as the other benches' reports are. S3's prices are the fleet
report's (one table, one date); SQS's are here, with the date they were written down.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from bench.fleet_report import MONTH_MINUTES, PER_1000, PRICES_AS_OF
from bench.report import write_section
from tests.support.s3_kinds import BILLED_AS, billed_as

if TYPE_CHECKING:
    from bench.fleet_idle import Measured, Setup

BEGIN, END = "<!-- fleet_idle:begin -->", "<!-- fleet_idle:end -->"
INTRO_ROW = (
    "| `fleet_idle.py` | an idle member's S3 requests per minute at the default intervals (a "
    "real daemon and Triton each, counted by kind at a proxy in front of moto), with 1 and 20 "
    "models: the code before issue 23 (a `git worktree`), this code polling, and this code with "
    "the SNS fan-out, all in the same run; the ratio after / before and what 100 and 1,000 "
    "members cost per month at S3 (and SQS) list prices; kept apart from `fleet.py`, whose "
    "idle count runs at a 5 s keepalive |"
)
# AWS SQS standard queues, us-east-1 list price as written down on SQS_PRICES_AS_OF
# (https://aws.amazon.com/sqs/pricing/): $0.40 per million requests after the first million a
# month, which are free per account (a fleet in one account shares them). An empty long poll
# is a request; SNS's deliveries to SQS are free.
SQS_PRICES_AS_OF = "2026-12-06"
SQS_PER_MILLION = 0.40
SQS_FREE = 1_000_000
FLEETS = (100, 1000)
FAN_OUT_MAX = 2.0  # requests per member per minute, the target with the fan-out
NEAR = 1.0  # requests a minute the polling target may be off by (the cadences it leaves out)


def minutes(measured: Measured) -> float:
    """The windows' whole span, in minutes."""
    return measured.window_s * len(next(iter(measured.s3.values()))) / 60.0


def rates(measured: Measured, setup: Setup) -> dict[str, float]:
    """Requests per minute by kind over the windows' whole span."""
    found: Counter[str] = Counter()
    for window in measured.s3[setup.name]:
        found.update(window)
    return {kind: n / minutes(measured) for kind, n in found.items()}


def window_totals(measured: Measured, setup: Setup) -> list[float]:
    """Each window's S3 requests per minute."""
    return [sum(w.values()) * 60.0 / measured.window_s for w in measured.s3[setup.name]]


def queue_rate(measured: Measured, setup: Setup) -> float:
    return sum(measured.queue[setup.name]) / minutes(measured)


def s3_monthly(by_kind: Mapping[str, float], members: int) -> float:
    """$ a month for ``members`` such members at S3's list prices."""
    return sum(
        rate * MONTH_MINUTES * members * PER_1000.get(billed_as(kind), 0.0) / 1000
        for kind, rate in by_kind.items()
    )


def sqs_monthly(per_minute: float, members: int) -> float:
    """$ a month for ``members`` members' SQS requests, the account's free million off."""
    return max(0.0, per_minute * MONTH_MINUTES * members - SQS_FREE) * SQS_PER_MILLION / 1e6


def polling_target(setup: Setup, defaults: Mapping[str, float]) -> float:
    """The keepalive plus, per poll, one listing per model, the models' listing and the
    index GET."""
    return 60.0 / defaults["keepalive"] + (setup.models + 2) * 60.0 / defaults["poll"]


def ratios(after: Sequence[float], before: Sequence[float]) -> list[float]:
    return [a / b for a, b in zip(after, before, strict=True)]


def baseline_of(setups: Sequence[Setup], setup: Setup) -> Setup:
    return next(s for s in setups if s.code == "before" and s.models == setup.models)


# --- tables --------------------------------------------------------------------------------


def requests_table(measured: Measured) -> str:
    setups = measured.setups
    by = {s.name: rates(measured, s) for s in setups}
    lines = [
        "| per member per minute | " + " | ".join(s.label for s in setups) + " |",
        "|---|" + "---:|" * len(setups),
    ]
    for kind in BILLED_AS:
        row = [by[s.name].get(kind, 0.0) for s in setups]
        lines.append(f"| {kind} | " + " | ".join(f"{v:.2f}" for v in row) + " |")
    others = [sum(v for k, v in by[s.name].items() if k not in BILLED_AS) for s in setups]
    lines.append("| other | " + " | ".join(f"{v:.2f}" for v in others) + " |")
    totals = [sum(by[s.name].values()) for s in setups]
    lines.append("| **S3, all** | " + " | ".join(f"**{v:.2f}**" for v in totals) + " |")
    spread = []
    for s in setups:
        each = window_totals(measured, s)
        spread.append(f"{statistics.median(each):.2f} ({min(each):.2f} to {max(each):.2f})")
    lines.append("| S3, median of the windows (min to max) | " + " | ".join(spread) + " |")
    ratios = []
    for s in setups:
        before = sum(by[baseline_of(setups, s).name].values())
        ratios.append(f"{sum(by[s.name].values()) / before:.3f}" if before else "-")
    lines.append("| ratio to before, same models | " + " | ".join(ratios) + " |")
    queue = [f"{queue_rate(measured, s):.2f}" for s in setups]
    lines.append("| SQS and SNS (not S3) | " + " | ".join(queue) + " |")
    return "\n".join(lines)


def cost_table(measured: Measured) -> str:
    setups = measured.setups
    columns = [(n, m) for n in FLEETS for m in sorted({s.models for s in setups})]
    lines = [
        "| $ per month | "
        + " | ".join(f"{n:,} members, {m} model{'s' if m > 1 else ''}" for n, m in columns)
        + " |",
        "|---|" + "---:|" * len(columns),
    ]

    def row(label: str, cells: Sequence[float], fmt: str = "{:,.2f}") -> None:
        lines.append(f"| {label} | " + " | ".join(fmt.format(c) for c in cells) + " |")

    def of(code: str, fan_out: bool, models: int) -> Setup:
        return next(s for s in setups if (s.code, s.fan_out, s.models) == (code, fan_out, models))

    def s3(code: str, fan_out: bool) -> list[float]:
        return [s3_monthly(rates(measured, of(code, fan_out, m)), n) for n, m in columns]

    before, after, fan_s3 = s3("before", False), s3("after", False), s3("after", True)
    fan_sqs = [sqs_monthly(queue_rate(measured, of("after", True, m)), n) for n, m in columns]
    fan = [a + b for a, b in zip(fan_s3, fan_sqs, strict=True)]
    row("before (S3)", before)
    row("after, no notifications (S3)", after)
    row("after, fan-out: S3", fan_s3)
    row("after, fan-out: SQS", fan_sqs)
    row("**after, fan-out: S3 + SQS**", fan)
    row("ratio after / before, no notifications", ratios(after, before), "{:.3f}")
    row("ratio after / before, fan-out (S3 + SQS)", ratios(fan, before), "{:.3f}")
    return "\n".join(lines)


def others_note(measured: Measured) -> str:
    """The requests counted as other, by setup, so that none goes unexplained."""
    setups = measured.setups
    found = []
    for s in setups:
        extra = {k: v for k, v in rates(measured, s).items() if k not in BILLED_AS}
        if extra:
            kinds = ", ".join(f"`{k}` {v:.2f}" for k, v in sorted(extra.items()))
            found.append(f"{s.label}: {kinds}")
    return "Other requests (per minute): " + ("; ".join(found) if found else "none") + "."


# --- verdict and section -------------------------------------------------------------------


def verdict(measured: Measured) -> str:
    setups, defaults = measured.setups, measured.after_defaults
    fan, poll = [], []
    for s in setups:
        total = sum(rates(measured, s).values())
        if s.code == "after" and s.fan_out:
            held = "met" if total <= FAN_OUT_MAX else "missed"
            fan.append(f"{s.models} model{'s' if s.models > 1 else ''} **{held}** ({total:.2f})")
        elif s.code == "after":
            target = polling_target(s, defaults)
            held = "met" if total <= target + NEAR else "missed"
            listings = rates(measured, s).get("releases LIST", 0.0) * defaults["poll"] / 60.0
            poll.append(
                f"{s.models} model{'s' if s.models > 1 else ''} **{held}** ({total:.2f} "
                f"against {target:.2f}, {total - target:+.2f}: {listings:.2f} release "
                "listings per poll)"
            )
    passes = ", ".join(
        f"{rates(measured, s).get('releases LIST', 0.0) / (s.models + 1):.2f} with "
        f"{s.models} model{'s' if s.models > 1 else ''}"
        for s in setups
        if s.code == "before"
    )
    before = measured.before_defaults["poll"]
    return (
        f"Result: with the fan-out at most {FAN_OUT_MAX:g} S3 requests per member per minute: "
        + ", ".join(fan)
        + ". Without notifications, at most the keepalive plus one listing per model per poll "
        f"(and the models' listing and the index GET per poll), {NEAR:g} a minute allowed for "
        "the slower cadences: " + ", ".join(poll) + ". "
        f"Passes a minute of the code before: {passes} ({60 / before:g} at most: "
        f"it waits {before:g} s after each pass, whose listings run one after the other, so a "
        "slow pass on a loaded host means fewer passes): its counts are a floor, and the "
        "ratios after / before err high."
    )


def print_summary(measured: Measured) -> None:
    print(f"\n{measured.machine}\n")
    print(f"{verdict(measured)} {logged(measured)}\n")
    print(requests_table(measured))
    print(f"\n{cost_table(measured)}\n\n{others_note(measured)}")


def listed(problems: Counter[str]) -> str:
    if not problems:
        return "none"
    return "; ".join(f"{n} x `{message}`" for message, n in problems.most_common(8))


def logged(measured: Measured) -> str:
    """The daemons' warnings and errors, those logged while idle apart from the start's."""
    start = measured.problems - measured.idle_problems
    return (
        f"Daemon warnings and errors logged once every member served: "
        f"{listed(measured.idle_problems)}; before (the start of six Tritons and daemons, "
        f"deploys): {listed(start)}."
    )


def section(args: argparse.Namespace, measured: Measured) -> str:
    setups, defaults, before = measured.setups, measured.after_defaults, measured.before_defaults
    targets = "; ".join(
        f"{s.models} model{'s' if s.models > 1 else ''}: {polling_target(s, defaults):.2f}"
        for s in setups
        if s.code == "after" and not s.fan_out
    )
    flags = f"--settle {args.settle:g} --window {args.window:g} --windows {args.windows}"
    span = minutes(measured)
    return f"""{BEGIN}
## fleet_idle

Smoke run (~3 min): `.venv/bin/python bench/fleet_idle.py --quick` (windows of 30 s, shorter
than a full scan: its numbers say only that everything runs). A bench of its own rather than
a part of `fleet.py`, whose idle count (a 5 s keepalive, one model, a directory store beside
S3) is kept as the record of the cost before issue 23.

- Measured: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC
- Machine: {measured.machine}
- Parameters: a settle of {args.settle:g} s after every member serves, then {args.windows}
  windows of {args.window:g} s back to back ({span:g} min)
  (`.venv/bin/python bench/fleet_idle.py {flags} --write-readme`)
- Members: six, running at once, one per configuration, each a bundled Triton with a
  repository of its own and `python -m controlplane serve` beside it, told only its name
  (`fleet.member`), its store and, for the fan-out, the topic: every interval is its code's
  default. **before**: the code of `{measured.baseline}` (the last commit before issue 23's
  work), checked out with `git worktree` and run from it (`PYTHONPATH`, with
  `PYTHONSAFEPATH` so that the working directory's package does not come first), defaults
  of then: poll {before["poll"]:g} s, heartbeat {before["heartbeat"]:g} s; every poll a
  listing of the desired state, one of the models and one of each model's releases.
  **after**: this code, defaults poll {defaults["poll"]:g} s, keepalive
  {defaults["keepalive"]:g} s, full scan {defaults["full_scan"]:g} s; departed members
  looked for every {defaults["forget"]:g} s; a poll lists the whole store in one request
  (S3 answers up to 1,000 keys a page; these stores hold under 100). **fan-out**: the same
  with `store.notifications.sns_topic_arn`: the member makes its own SQS queue and subscribes
  it to the topic that the bucket's events go to (`tests/support/s3.py` `notify_topic`, as
  docs/notifications.md sets it up). Each with 1 and with 20 models.
- Store: a bucket per member on one moto server (a process of its own), holding N models
  with one small release each (`write_scale_release`, `upload_release_dir`); each member
  serves the first, `{measured.served}` (deployed and answering inference before the
  settle), the others only sit in its store. Nothing changes while the windows run.
- Counting: a proxy per member in front of moto (`CountingProxy`), through which it reaches
  S3, SQS and SNS; each S3 request put down to its kind as the idle-cost test does
  (`tests/support/s3_kinds.py`): `beat PUT` (its heartbeat), `name check GET` (its own
  heartbeat read before writing), `index GET` (`_controlplane/generations.json` with
  `If-None-Match`, a 304), `desired LIST`, `members LIST` (departed members), `releases LIST`
  (the models and their releases), other (listed below the tables). SQS and SNS counted apart.
- Per minute: a kind's requests over the windows' whole span ({span:g} min), divided by
  its minutes: at the defaults, 3 windows of 300 s hold whole cycles of the keepalive, the
  full scan and the look for departed members (900 s); not the median of the windows per
  kind, which would drop that look (it falls in one window of three). The median and range
  of the windows' totals are shown beside the totals.
- Prices: S3 Standard, us-east-1, list prices as written down on {PRICES_AS_OF}
  (https://aws.amazon.com/s3/pricing/, not fetched by the bench): PUT, COPY, POST, LIST
  $0.005 per 1,000; GET (a 304 too) and other reads $0.0004 per 1,000; DELETE free. SQS
  standard queues as written down on {SQS_PRICES_AS_OF} (https://aws.amazon.com/sqs/pricing/):
  $0.40 per million requests after the first million a month, free per account (taken off
  once per fleet); an empty long poll is a request; SNS's deliveries to SQS are free, and
  at idle nothing is published. A month is 730 hours; no transfer is billed in-region.
- Targets (issue 23, point 1): with the fan-out at most {FAN_OUT_MAX:g} requests per member
  per minute, with 1 and with 20 models; without notifications, the keepalive plus one
  listing per model per poll plus the models' listing and the index GET per poll
  ({targets}
  a minute), within {NEAR:g} a minute (what the target leaves out: the name check, the full
  scan's listing and GET, the look for departed members, about 0.6 a minute).

{verdict(measured)} {logged(measured)}

{requests_table(measured)}

{cost_table(measured)}

{others_note(measured)}
{END}"""


def write_readme(args: argparse.Namespace, measured: Measured) -> None:
    """Replace the fleet_idle section of bench/README.md, or append it; and its intro row."""
    text = section(args, measured)
    write_section(text, begin=BEGIN, end=END, script="fleet_idle.py", row=INTRO_ROW)
