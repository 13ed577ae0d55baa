"""The fleet bench's report: the tables, the verdict, its section of bench/README.md.

Kept apart from the measuring, as the other benches' reports are. It writes only between its
own markers, plus its one row in the README's intro table. Prices are constants here, with the
date they were written down, because the bench cannot know today's.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from bench.fleet_store import BEAT, POLL, IdleCounts
from bench.report import write_section

BEGIN, END = "<!-- fleet:begin -->", "<!-- fleet:end -->"
INTRO_ROW = (
    "| `fleet.py` | fleets of 2, 3 and 4 members (a Triton and a daemon each) against a fleet "
    "of one, with the default poll interval (10 s) and with 1 s: time from the API call to "
    "every member serving the new release as clients see it, the API's fleet-wait answer, "
    "where the time goes (the receiving member's deploy, the followers' poll wait and "
    "deploys), failed requests of clients on every member; an idle fleet's store requests "
    "per member per minute on S3 (through a counting proxy) and on a directory store (strace), "
    "and what 100 members cost per month at S3 list prices |"
)

# AWS S3 Standard, us-east-1, list prices per 1,000 requests as written down on PRICES_AS_OF
# (https://aws.amazon.com/s3/pricing/): PUT, COPY, POST, LIST $0.005; GET, SELECT and all
# other requests $0.0004; DELETE free. Requests from EC2 in the same region move no billed data.
PRICES_AS_OF = "2026-12-01"
PER_1000 = {"LIST": 0.005, "PUT": 0.005, "POST": 0.005, "GET": 0.0004, "HEAD": 0.0004}
MONTH_MINUTES = 730 * 60  # AWS bills a month as 730 hours
FLEET = 100

Runs = Sequence[dict[str, float]]
Phases = Mapping[float, Runs]

ROWS = [  # key, label, format; cells: median over runs (min to max)
    ("all_s", "**call -> every member serving, as its clients see it (s)**", "{:.2f}"),
    ("api_s", "call -> API answer (`fleet: true` waits for every live member) (s)", "{:.2f}"),
    ("diff_s", "every member serving - the fleet of one, same run (s)", "{:+.2f}"),
    ("ratio", "ratio to the fleet of one, same run", "{:.2f}"),
    ("target_s", "target: fleet of one + poll interval + 1 s (s)", "{:.2f}"),
    ("margin_s", "**margin to the target (s)** (>= 0: met)", "{:+.2f}"),
    ("leader_seen_s", "receiving member: call -> its clients see the release (s)", "{:.2f}"),
    ("publish_s", "receiving member: call -> desired state published (s)", "{:.2f}"),
    ("wait_min_s", "followers: publish -> own operation created (poll wait), first (s)", "{:.2f}"),
    ("wait_max_s", "followers: publish -> own operation created (poll wait), last (s)", "{:.2f}"),
    ("follower_op_max_s", "followers: own deploy (operation), longest (s)", "{:.2f}"),
    (
        "told_s",
        "every member serving had each follower been told at the publish (s)",
        "{:.2f}",
    ),
    ("follower_load_max_s", "followers: of which the `load` step, longest (s)", "{:.2f}"),
    ("after_publish_s", "publish -> every member serving (s)", "{:.2f}"),
    ("api_after_ops_s", "last follower's operation done -> API answer (s)", "{:.2f}"),
    ("api_after_all_s", "every member serving -> API answer (s)", "{:.2f}"),
]
COUNTS = [
    ("requests", "client requests during rollouts"),
    ("failed", "failed requests (any exception)"),
    ("back", "answers from the old release after the same client had the new one"),
    ("unexpected", "answers matching neither release"),
    ("free_steps", "rollouts where a deploy had to free a slot first (expected 0)"),
]


def sizes_of(runs: Runs) -> list[int]:
    return sorted({int(key.split("_", 1)[0]) for key in runs[0]})


def derive(poll: float, runs: Runs) -> list[dict[str, float]]:
    """Each run with its comparisons to the same run's fleet of one."""
    out = []
    for run in runs:
        run = dict(run)
        single = run["1_all_s"]
        for size in sizes_of(runs):
            run[f"{size}_diff_s"] = run[f"{size}_all_s"] - single
            run[f"{size}_ratio"] = run[f"{size}_all_s"] / single
            run[f"{size}_target_s"] = single + poll + 1.0
            run[f"{size}_margin_s"] = single + poll + 1.0 - run[f"{size}_all_s"]
        out.append(run)
    return out


def cell(runs: Runs, key: str, fmt: str) -> str:
    values = [run[key] for run in runs if key in run]
    if not values:
        return "-"
    low, high = fmt.format(min(values)), fmt.format(max(values))
    spread = "" if low == high else f" ({low} to {high})"
    return fmt.format(statistics.median(values)) + spread


def phase_table(poll: float, runs: Runs) -> str:
    runs = derive(poll, runs)
    sizes = sizes_of(runs)
    head = " | ".join("fleet of 1 (baseline)" if s == 1 else f"fleet of {s}" for s in sizes)
    lines = [f"| poll {poll:g} s: median (min to max) over runs | {head} |"]
    lines.append("|---|" + "---:|" * len(sizes))
    for key, label, fmt in ROWS:
        cells = [cell(runs, f"{size}_{key}", fmt) for size in sizes]
        if any(c != "-" for c in cells[1:]) or key in ("all_s", "api_s", "leader_seen_s"):
            lines.append(f"| {label} | {' | '.join(cells)} |")
    return "\n".join(lines)


def counts_table(phases: Phases) -> str:
    polls = list(phases)
    lines = [
        "| count (total over runs and fleets) | "
        + " | ".join(f"poll {p:g} s" for p in polls)
        + " |",
        "|---|" + "---:|" * len(polls),
    ]
    for key, label in COUNTS:
        cells = [
            f"{sum(v for run in phases[p] for k, v in run.items() if k.endswith('_' + key)):.0f}"
            for p in polls
        ]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    return "\n".join(lines)


def total(phases: Phases, keys: tuple[str, ...]) -> float:
    """A count summed over every poll interval, run and fleet size."""
    suffixes = tuple(f"_{key}" for key in keys)
    return sum(
        v
        for runs in phases.values()
        for run in runs
        for k, v in run.items()
        if k.endswith(suffixes)
    )


def monthly(per_minute: float, method: str, members: int = FLEET) -> float:
    return per_minute * MONTH_MINUTES * members * PER_1000.get(method, 0.0) / 1000


def s3_table(idle: IdleCounts) -> str:
    lines = [
        "| idle, S3 (per member) | method | requests per minute | per month (730 h) | "
        f"{FLEET} members, $ per month |",
        "|---|---|---:|---:|---:|",
    ]
    for (purpose, method), rate in sorted(idle.s3.items()):
        lines.append(
            f"| {purpose} | {method} | {rate:.2f} | {rate * MONTH_MINUTES:,.0f} | "
            f"{monthly(rate, method):,.2f} |"
        )
    total = sum(idle.s3.values())
    cost = sum(monthly(rate, method) for (_p, method), rate in idle.s3.items())
    lines.append(
        f"| **total** | | **{total:.2f}** | **{total * MONTH_MINUTES:,.0f}** | **{cost:,.2f}** |"
    )
    return "\n".join(lines)


def rollout_table(idle: IdleCounts) -> str:
    lines = [
        f"| one rollout on S3, fleet of {idle.rollout_members} (all members) | method | requests |",
        "|---|---|---:|",
    ]
    lines += [
        f"| {purpose} | {method} | {n:.0f} |"
        for (purpose, method), n in sorted(idle.rollout.items())
    ]
    return "\n".join(lines)


def local_table(idle: IdleCounts) -> str:
    if not idle.local:
        return f"Directory store: not counted {idle.local_note}".strip()
    kinds = sorted({kind for _purpose, kind in idle.local})
    purposes = sorted({purpose for purpose, _kind in idle.local})
    lines = [
        "| idle, directory store (per member per minute) | "
        + " | ".join(f"`{k}`" for k in kinds)
        + " | all |",
        "|---|" + "---:|" * (len(kinds) + 1),
    ]
    for purpose in purposes:
        row = [idle.local.get((purpose, kind), 0.0) for kind in kinds]
        lines.append(f"| {purpose} | {' | '.join(f'{v:.1f}' for v in row)} | {sum(row):.1f} |")
    return "\n".join(lines)


def table(phases: Phases, idle: IdleCounts) -> str:
    parts = [phase_table(poll, runs) for poll, runs in phases.items()]
    parts += [counts_table(phases), s3_table(idle), rollout_table(idle), local_table(idle)]
    return "\n\n".join(parts)


def verdict(phases: Phases, idle: IdleCounts) -> str:
    bad = sum(
        v
        for runs in phases.values()
        for run in runs
        for k, v in run.items()
        if k.endswith(("_failed", "_back", "_unexpected"))
    )
    requests = sum(
        v
        for runs in phases.values()
        for run in runs
        for k, v in run.items()
        if k.endswith("_requests")
    )
    held = []
    for poll, runs in phases.items():
        runs = derive(poll, runs)
        for size in sizes_of(runs)[1:]:
            margins = [run[f"{size}_margin_s"] for run in runs]
            median = statistics.median(margins)
            met = sum(m >= 0 for m in margins)
            held.append(
                f"poll {poll:g} s, {size} members: **{'met' if median >= 0 else 'missed'}** at "
                f"the median ({median:+.2f} s; met in {met} of {len(margins)} runs; every "
                f"member after {statistics.median(run[f'{size}_all_s'] for run in runs):.2f} s "
                f"against {statistics.median(run['1_all_s'] for run in runs):.2f} s alone)"
            )
    cost = sum(monthly(rate, method) for (_p, method), rate in idle.s3.items())
    per_minute = sum(idle.s3.values())
    return (
        f"Result: 0 failed requests during rollouts: **{'met' if bad == 0 else 'missed'}** "
        f"({bad:.0f} failed or wrong of {requests:.0f}). Every member serving within a fleet "
        f"of one + one poll interval + 1 s: " + "; ".join(held) + ". "
        f"An idle member asks S3 {per_minute:.1f} times a minute (poll {POLL:g} s, heartbeat "
        f"{BEAT:g} s, one model): {FLEET} members cost ${cost:,.2f} a month at S3 Standard "
        f"us-east-1 list prices as of {PRICES_AS_OF}."
    )


def section(args: argparse.Namespace, summary: str, phases: Phases, idle: IdleCounts) -> str:
    flags = (
        "--quick --write-readme"
        if args.quick
        else (
            f"--runs {args.runs} --polls {','.join(f'{p:g}' for p in args.polls)} "
            f"--clients {args.clients} --every {args.every:g} --idle-seconds {args.idle_seconds:g} "
            "--write-readme"
        )
    )
    return f"""{BEGIN}
## fleet

Smoke run (~2 min): `.venv/bin/python bench/fleet.py --quick`.

- Measured: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC
- Machine: {summary}
- Parameters: {args.runs} runs per poll interval, fleets of {", ".join(map(str, args.sizes))}
  (`.venv/bin/python bench/fleet.py {flags}`)

{verdict(phases, idle)}

{table(phases, idle)}
{END}"""


def write_readme(text: str) -> None:
    """Replace the fleet section of bench/README.md, or append it; and its intro row."""
    write_section(text, begin=BEGIN, end=END, script="fleet.py", row=INTRO_ROW)
