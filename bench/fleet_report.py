"""The fleet bench's report: the tables, the verdict, its section of bench/README.md.

Kept apart from the measuring, as the other benches' reports are. It writes only between its
own markers, plus its one row in the README's intro table. Prices are constants here, with the
date they were written down, because the bench cannot know today's.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from bench.fleet_store import BEAT, POLL, IdleCounts
from bench.report import write_section

BEGIN, END = "<!-- fleet:begin -->", "<!-- fleet:end -->"
INTRO_ROW = (
    "| `fleet.py` | fleets of 2, 3 and 4 members (a Triton and a daemon each) against a fleet "
    "of one, with the default poll interval (10 s) and with 1 s: time from the API call to "
    "every member serving the new release as clients see it, the API's fleet-wait answer, "
    "where the time goes (the receiving member's deploy, the followers' wait for the wake and "
    "their deploys), failed requests of clients on every member; an idle fleet's store requests "
    "per member per minute on S3 (through a counting proxy) and on a directory store (strace), "
    "and what 100 members cost per month at S3 list prices, at a 5 s keepalive (at today's "
    "defaults, before and after issue 23: `fleet_idle.py`) |"
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
    ("wait_min_s", "followers: publish -> own operation created (wake), first (s)", "{:.2f}"),
    ("wait_max_s", "followers: publish -> own operation created (wake), last (s)", "{:.2f}"),
    ("follower_op_max_s", "followers: own deploy (operation), longest (s)", "{:.2f}"),
    ("follower_load_max_s", "followers: of which the `load` step, longest (s)", "{:.2f}"),
    ("after_publish_s", "publish -> every member serving (s)", "{:.2f}"),
    (
        "told_s",
        "call -> every member serving, had each follower been told at the publish (s)",
        "{:.2f}",
    ),
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


def cost_split(idle: IdleCounts) -> str:
    """The idle S3 bill of FLEET members by purpose."""
    cost = {p: 0.0 for p, _m in idle.s3}
    for (purpose, method), rate in idle.s3.items():
        cost[purpose] += monthly(rate, method)
    whole = sum(cost.values()) or 1.0
    return ", ".join(
        f"{purpose} {100 * c / whole:.0f} %"
        for purpose, c in sorted(cost.items(), key=lambda x: -x[1])
    )


def verdict(phases: Phases, idle: IdleCounts) -> str:
    bad = total(phases, ("failed", "back", "unexpected"))
    requests = total(phases, ("requests",))
    held = []
    for poll, runs in phases.items():
        runs = derive(poll, runs)
        single = statistics.median(run["1_all_s"] for run in runs)
        sizes = []
        for size in sizes_of(runs)[1:]:
            margins = [run[f"{size}_margin_s"] for run in runs]
            median = statistics.median(margins)
            every = statistics.median(run[f"{size}_all_s"] for run in runs)
            sizes.append(
                f"{size} members **{'met' if median >= 0 else 'missed'}** ({every:.2f} s, "
                f"margin {median:+.2f} s, met in {sum(m >= 0 for m in margins)} of "
                f"{len(margins)} runs)"
            )
        held.append(f"with poll {poll:g} s (alone {single:.2f} s): {', '.join(sizes)}")
    cost = sum(monthly(rate, method) for (_p, method), rate in idle.s3.items())
    per_minute = sum(idle.s3.values())
    local = sum(idle.local.values())
    return (
        f"Result: 0 failed requests during rollouts: **{'met' if bad == 0 else 'missed'}** "
        f"({bad:.0f} failed or wrong of {requests:.0f}). Every member serving within a fleet "
        f"of one + one poll interval + 1 s, at the median over runs: " + "; ".join(held) + ". "
        f"An idle member asks S3 {per_minute:.1f} times a minute at poll {POLL:g} s and a "
        f"{BEAT:g} s keepalive with one model: {FLEET} members cost **${cost:,.2f} a month** at "
        f"S3 Standard us-east-1 list prices as of {PRICES_AS_OF} ({cost_split(idle)}); a "
        f"{BEAT:g} s beat was the default until issue 23, and what an idle member costs at "
        "today's defaults, before and after the issue, with 1 and 20 models, is "
        "`fleet_idle.py`'s (below). On a directory "
        f"store an idle member makes {local:.0f} file-system calls a minute on the store."
    )


def logged(problems: Counter[str]) -> str:
    """The daemons' warnings and errors, most frequent first."""
    if not problems:
        return "Daemon warnings and errors logged: none."
    found = "; ".join(f"{n} x `{message}`" for message, n in problems.most_common(8))
    return f"Daemon warnings and errors logged: {found}."


def section(
    args: argparse.Namespace,
    summary: str,
    phases: Phases,
    idle: IdleCounts,
    problems: Counter[str],
) -> str:
    flags = (
        "--quick --write-readme"
        if args.quick
        else (
            f"--runs {args.runs} --polls {','.join(f'{p:g}' for p in args.polls)} "
            f"--clients {args.clients} --every {args.every:g} --idle-seconds {args.idle_seconds:g} "
            f"--idle-members {args.idle_members} --write-readme"
        )
    )
    sizes = ", ".join(map(str, args.sizes))
    polls = " and ".join(f"{p:g} s" for p in args.polls)
    members = sum(args.sizes)
    return f"""{BEGIN}
## fleet

Smoke run (~1.5 min): `.venv/bin/python bench/fleet.py --quick`.

- Measured: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC
- Machine: {summary}
- Parameters: {args.runs} runs per poll interval ({polls}), fleets of {sizes} members;
  {args.clients} clients per rollout (`.venv/bin/python bench/fleet.py {flags}`)
- Members: each a bundled Triton with a repository of its own and `python -m controlplane
  serve` beside it, configured by environment only: `CONTROLPLANE_FLEET__MEMBER`,
  `CONTROLPLANE_STORE__POLL_INTERVAL_SECONDS` (the interval under test) and
  `CONTROLPLANE_FLEET__KEEPALIVE_SECONDS=5` (the heartbeat's default until issue 23, 60 s
  since; `fleet.heartbeat_seconds` then); everything else is the default
  (strategy `blue-green`, `retire_after_seconds` 30 s). Each fleet size has a directory store
  of its own; all {members} members of one poll interval run at once, on the machine above.
- Model: Python backend, `OUTPUT0 = INPUT0 * k`, one CPU instance per slot; r0 serves on every
  member before the runs. Each run deploys the next release once on every fleet, the sizes
  taking turns going first: `POST /v1/models/fleet/deploy {{"release": "r<i>", "wait": true,
  "fleet": true}}` through one member (a different one each run). The fleet of one makes the
  same call: it is the baseline, a single member's deploy, measured in the same run.
- Clock: from the API call to the end of the first request that the new release answered on
  the last member to serve it (its clients' view, one request every {args.every * 1e3:.0f} ms per
  client); the API's answer is timed too. {args.clients} gRPC clients per rollout, spread over
  the fleet's members (at least one each), from before the call until every member answered
  a few more times: the same load for every size, since all members share the CPUs.
- Split, from the daemons' records (their clocks are this host's): the receiving member's
  `publish` step (it deploys first and publishes once it serves), each follower's operation
  (trigger `fleet`): created (publish -> created is its wait to hear of it: the receiving
  member wakes the others over their APIs at once, `POST /v1/fleet/wake`, and a follower that
  missed the wake reads at its next poll) and its duration. "Had each follower been told at the
  publish" is each member's serving time minus that wait.
- Pauses: before each rollout of a fleet, at least 35 s after its previous one (its old slot
  retired, so every deploy loads an empty slot: no `free` step), then a random pause of up to
  one poll interval: a follower's passes are timed from the end of its last follow, so
  rollouts back to back would always meet it at the same point of its cycle.
- The target against the design: a rollout is the receiving member's deploy, then the
  followers' wait to hear of it, then their own deploys, since followers start only once the
  release serves on the first member (so a bad release stops there). With the wake the wait is
  a fraction of a second (the wake, then the follower's read of the store and the start of its
  operation), so a rollout is about two deploys whatever the poll interval: within the
  target when one deploy is shorter than the poll interval + 1 s (10 s: always here; 1 s: a
  deploy here takes 2-3 s, so it cannot hold without loading the release on the followers
  before it served anywhere, which is what the design refuses). Without the wake the wait was
  0 to one interval (the previous figures, in git history: 14.15 s for 3 members at 10 s). Here
  the followers' deploys share the CPUs (they grow with the fleet); on hosts of their own each
  would take about as long as the single deploy.
- Idle store traffic (poll {POLL:g} s, keepalive {BEAT:g} s, set explicitly: the defaults
  until issue 23; `fleet_idle.py` counts at today's, before and after the issue): two
  more fleets of {idle.s3_members} members serving one model, counted for {args.idle_seconds:g} s
  before the rollouts. S3 is moto's server (its own process) with a counting proxy per member
  (the tests' `FaultProxy`, no fault scripted), each request put in a purpose by its key or
  listing prefix: `desired` (`_controlplane/desired/`: the sync's listing and one GET per
  model), `heartbeats` (`_controlplane/members/`), `releases` (the release watcher's
  listings: the models, then each model's objects). A directory store is counted with `strace
  -f` attached to each member's daemon, every call on a path under the store (an open,
  a directory read, a stat, a rename or fsync is a round trip or a lookup on NFS). Each
  member's window is cut to whole poll cycles (first to last desired-state listing in it).
- Prices: AWS S3 Standard, us-east-1, list prices as of {PRICES_AS_OF} (the date these were
  written down from https://aws.amazon.com/s3/pricing/, not fetched by the bench): PUT, COPY,
  POST, LIST $0.005 per 1,000 requests; GET and the other reads $0.0004 per 1,000;
  DELETE free; a month is 730 hours; no data transfer charge from EC2 in the same region.
- One rollout on S3: r1 through one member of the idle S3 fleet, before the idle window, every
  member's requests from the call to the answer. The member that waits (`fleet: true`) reads
  the desired state and every heartbeat (a listing and one GET per member, one after the
  other) every 0.25 s until every member serves.
- Daemon warnings at the end: the bench stops the members soon after the last rollouts, when
  the retire of an old slot (30 s after a switch) may be unloading it; the daemon then logs
  `operation interrupted (shutdown)` for that retire. Nothing else is expected in the logs;
  the bench prints every warning and error the daemons logged.
- Targets: 0 failed requests during rollouts; every member serving within the fleet of one +
  one poll interval + 1 s (median over runs of each run's margin; each run against its own
  fleet of one).

{verdict(phases, idle)} {logged(problems)}

{table(phases, idle)}
{END}"""


def write_readme(text: str) -> None:
    """Replace the fleet section of bench/README.md, or append it; and its intro row."""
    write_section(text, begin=BEGIN, end=END, script="fleet.py", row=INTRO_ROW)
