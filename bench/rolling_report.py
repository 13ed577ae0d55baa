"""The rolling bench's report: the tables, the verdict, its section of bench/README.md.

Kept apart from the measuring, as the other benches' reports are. It writes only between its
own markers, plus its one row in the README's intro table.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime

from bench.report import write_section

BEGIN, END = "<!-- rolling:begin -->", "<!-- rolling:end -->"
TARGET_S = 1.0  # overhead per member beyond its own work (and the configured waits)
INTRO_ROW = (
    "| `rolling.py` | rolling updates of a model that fits once in GPU memory (GPU stand-ins "
    "whose memory follows each Triton), fleets of 2, 3 and 4 members behind Debian's HAProxy "
    "with clients calling through it: the rollout's wall time from the API call to its answer "
    "against the sum of each member's own work (drain, unload, memory, load, preflight, switch, "
    "from its operation's steps) and the configured `rollout.unready_seconds` waits, the "
    "overhead per member and where it goes, failed calls through HAProxy, and the most members "
    "out of rotation at once |"
)

Runs = Sequence[dict[str, float]]

ROWS = [  # key, label, format; cells: median over runs (min to max)
    ("wall_s", "**call -> API answer: the rollout (s)**", "{:.2f}"),
    ("per_member_s", "the rollout / members (s)", "{:.2f}"),
    (
        "work_s",
        "work: sum over members of drain + unload + memory + load + preflight + switch (s)",
        "{:.2f}",
    ),
    (
        "waits_s",
        "configured waits: 2 x `unready_seconds` per member (before the drain, rejoin) (s)",
        "{:.2f}",
    ),
    ("baseline_s", "work + configured waits (s)", "{:.2f}"),
    ("ratio", "ratio rollout / (work + configured waits)", "{:.2f}"),
    (
        "over_ex_s",
        "**overhead per member, beyond work and configured waits (s)** (target <= 1)",
        "{:.2f}",
    ),
    ("over_in_s", "overhead per member, the configured waits counted as overhead (s)", "{:.2f}"),
    ("before_s", "where it goes: call -> the first member holds its turn (s)", "{:.2f}"),
    (
        "inside_s",
        "where it goes: inside the turns, besides work and waits (headroom, place, record) (s)",
        "{:.2f}",
    ),
    (
        "between_s",
        "where it goes: between turns, one member's rejoin done -> the next holds its turn (s)",
        "{:.2f}",
    ),
    ("after_s", "where it goes: the last rejoin done -> API answer (s)", "{:.2f}"),
    ("first_gap_s", "between turns: receiving member -> first follower (s)", "{:.2f}"),
    ("publish_s", "of which: rejoin done -> desired state published (s)", "{:.2f}"),
    ("wake_s", "of which: published -> first follower's operation created (wake) (s)", "{:.2f}"),
    (
        "prepare_s",
        "of which: follower's resolve, fetch, verify, check, headroom, turn (s)",
        "{:.2f}",
    ),
    (
        "later_gap_s",
        "between turns: follower -> follower, mean (turn looked at every 0.5 s) (s)",
        "{:.2f}",
    ),
    ("work_member_s", "work per member (s)", "{:.2f}"),
    (
        "drain_s",
        "per member: drain, after the configured wait (pending requests at 0) (s)",
        "{:.3f}",
    ),
    ("unload_s", "per member: unload (s)", "{:.2f}"),
    ("memory_s", "per member: memory (GPU memory back) (s)", "{:.3f}"),
    ("load_s", "per member: load (s)", "{:.2f}"),
    ("preflight_s", "per member: preflight (s)", "{:.3f}"),
    ("switch_s", "per member: switch (s)", "{:.3f}"),
    ("out_median_s", "out of rotation in HAProxy's eyes, per member, median (s)", "{:.2f}"),
    ("out_max_s", "out of rotation in HAProxy's eyes, longest (s)", "{:.2f}"),
]
COUNTS = [  # key, label, how runs combine
    ("requests", "calls through HAProxy during rollouts", "sum"),
    ("failed", "failed calls (any exception)", "sum"),
    ("unexpected", "answers matching neither the old nor the new release", "sum"),
    ("max_out", "most members out of rotation at once (HAProxy)", "max"),
    ("left_not_once", "members that did not leave rotation exactly once in a rollout", "sum"),
]


def sizes_of(runs: Runs) -> list[int]:
    return sorted({int(key.split("_", 1)[0]) for key in runs[0]})


def median(runs: Runs, key: str) -> float:
    return statistics.median(run[key] for run in runs)


def cell(runs: Runs, key: str, fmt: str) -> str:
    values = [run[key] for run in runs if key in run]
    if not values:
        return "-"
    low, high = fmt.format(min(values)), fmt.format(max(values))
    spread = "" if low == high else f" ({low} to {high})"
    return fmt.format(statistics.median(values)) + spread


def total(runs: Runs, key: str, how: str) -> float:
    values = [run[key] for run in runs]
    return max(values) if how == "max" else sum(values)


def table(runs: Runs) -> str:
    sizes = sizes_of(runs)
    head = " | ".join(f"fleet of {s}" for s in sizes)
    lines = [f"| median (min to max) over runs | {head} |", "|---|" + "---:|" * len(sizes)]
    for key, label, fmt in ROWS:
        cells = [cell(runs, f"{size}_{key}", fmt) for size in sizes]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    lines += ["", f"| count (over runs) | {head} |", "|---|" + "---:|" * len(sizes)]
    for key, label, how in COUNTS:
        cells = [f"{total(runs, f'{size}_{key}', how):.0f}" for size in sizes]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    return "\n".join(lines)


def logged(problems: Counter[str]) -> str:
    if not problems:
        return "Daemon warnings and errors logged: none."
    found = "; ".join(f"{n} x `{message}`" for message, n in problems.most_common(5))
    return f"Daemon warnings and errors logged: {found}."


def verdict(runs: Runs, problems: Counter[str], unready: float) -> str:
    sizes = sizes_of(runs)
    failed = sum(total(runs, f"{s}_{k}", "sum") for s in sizes for k in ("failed", "unexpected"))
    calls = sum(total(runs, f"{s}_requests", "sum") for s in sizes)
    most = max(total(runs, f"{s}_max_out", "max") for s in sizes)
    overhead = {s: median(runs, f"{s}_over_ex_s") for s in sizes}
    counted = {s: median(runs, f"{s}_over_in_s") for s in sizes}
    met = all(v <= TARGET_S for v in overhead.values())

    def each(values: dict[int, float]) -> str:
        return ", ".join(f"{s} members {v:.2f} s" for s, v in values.items())

    return (
        f"Result: overhead at most {TARGET_S:g} s per member beyond its own work and the "
        f"configured waits: **{'met' if met else 'missed'}** (median over runs: "
        f"{each(overhead)}). Counting the configured waits (2 x `unready_seconds` = "
        f"{2 * unready:g} s per member here) as overhead, it is {each(counted)}"
        + (
            f": above {TARGET_S:g} s by design, since the waits alone are {2 * unready:g} s"
            if 2 * unready > TARGET_S
            else ""
        )
        + f". 0 failed calls through HAProxy: "
        f"**{'met' if failed == 0 else 'missed'}** ({failed:.0f} failed or wrong of "
        f"{calls:.0f}). At most 1 member out of rotation at once: "
        f"**{'met' if most <= 1 else 'missed'}** (at most {most:.0f}). {logged(problems)}"
    )


def where(runs: Runs) -> str:
    """Where a member's time goes, from the largest fleet's medians (the hand-checked part
    said as such)."""
    big = max(sizes_of(runs))

    def m(key: str) -> float:
        return median(runs, f"{big}_{key}")

    later = f"{m('later_gap_s'):.2f} s" if any(f"{big}_later_gap_s" in r for r in runs) else "-"
    each = m("per_member_s")
    return f"""Where the time goes (fleet of {big}, medians): of a member's ~{each:.1f} s,
  {m("work_member_s"):.2f} s is work, nearly all of it Triton's: `load` {m("load_s"):.2f} s and
  `unload` {m("unload_s"):.2f} s (Triton alone takes about 1.16 s from the unload call to
  UNAVAILABLE for this model, the Python stub shutting down: checked once by hand on the same
  machine, so ~0.1 s of the step is the daemon's look every poll and its residue audit); the
  drain past its wait, `memory`, `preflight` and `switch` are milliseconds. Of the overhead
  ({m("over_ex_s"):.2f} s a member), the largest part is between turns: a follower waiting for
  the turn looks again every 0.5 s, so each follower-to-follower hand-off costs {later} on
  average, while the first hand-off (publish, wake, the follower's fetch and verify of a small
  release) costs {m("first_gap_s"):.2f} s; inside each turn ~{m("inside_s") / big:.2f} s (mostly
  `record`); the fleet wait's 0.25 s look adds {m("after_s"):.2f} s at the end. HAProxy sees a
  member out ~{m("out_median_s"):.1f} s: from 0.3 s after its drain starts to 0.3 to 0.6 s into
  its `rejoin`. Followers hear of the release only once the receiving member has served it and
  handed its turn on; the first follower's fetch and verify then lie on the rollout's path
  (the later ones fetch while they wait), which a release of many GiB would make long."""


def section(args: argparse.Namespace, summary: str, runs: Runs, problems: Counter[str]) -> str:
    flags = (
        "--quick --write-readme"
        if args.quick
        else (
            f"--runs {args.runs} --callers {args.callers} --pause {args.pause:g} "
            f"--unready-seconds {args.unready:g} --write-readme"
        )
    )
    unready, poll, beat = args.unready, args.poll, args.beat
    sizes = ", ".join(map(str, args.sizes))
    return f"""{BEGIN}
## Rolling updates (bench/rolling.py)

Smoke run (~1 min): `.venv/bin/python bench/rolling.py --quick`.

- Measured: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC
- Machine: {summary}
- Parameters: {args.runs} rollouts per fleet, fleets of {sizes} members, all up at once;
  {args.callers} gRPC callers through each fleet's HAProxy, {args.pause * 1e3:.0f} ms apart
  (`.venv/bin/python bench/rolling.py {flags}`)
- Fleets: built as `tests/integration/test_rolling_fleet.py` builds them
  (`tests/support/rolling_fleet.py`): per member a bundled Triton with a repository of its
  own, `python -m controlplane serve` beside it and a GPU stand-in (16 GiB) whose used memory
  follows the model's slots its Triton has loaded (9 GiB a release, the `memory_hint_bytes`
  the release declares): the model fits once, so `auto` (the default strategy) rolls. Debian's
  HAProxy in front of each fleet: gRPC (h2c) round robin over the members' Tritons, each
  checked on its daemon's `/readyz` every 300 ms (`fall 1`, `rise 2`). Each fleet has a
  directory store of its own. Daemons are configured by environment only:
  `rollout.unready_seconds` **{unready:g} s for the bench** (the default is 5 s; a load
  balancer checking every 300 ms notices within 0.3 s and takes a member back within 0.6 s),
  `drain_timeout_seconds` 10, `memory.return_seconds` 20 (as the tests set them), poll
  {poll:g} s and heartbeat {beat:g} s (the defaults); everything else is the default.
- Model: Python backend, `OUTPUT0 = INPUT0 * k`, one instance per slot (`KIND_AUTO`: on CPU
  here), a release per run (r<i> answers i + 1); r0 serves everywhere before the runs. Each run
  deploys the next release once on every fleet, the sizes taking turns going first:
  `POST /v1/models/rolling/deploy {{"release": "r<i>", "wait": true, "fleet": true}}` through
  one member (a different one each run). It rolls first and publishes the desired state once it
  serves again; the others hear of it at once (the wake), fetch and verify, and take turns.
- Clock: from the API call to its answer (the fleet wait ends once every live member serves the
  release and every turn has been handed on).
- Work, the baseline, from each member's own operation (`GET /v1/operations?model=rolling`),
  the same rollout: its `drain` (less the configured wait inside it: Triton's pending requests
  to 0), `unload`, `memory` (until the GPU stand-in shows the memory back), `load`,
  `preflight` and `switch` steps, summed over the members: what one member at a time has to do.
- Configured waits, deliberate and reported apart: `rollout.unready_seconds` at the start of
  the drain (the load balancer's time to notice `/readyz` 503) and again in `rejoin` (the member
  serves and is back in rotation, and keeps its turn that long, the balancer's time to send it
  requests again before the next member leaves): 2 x {unready:g} s per member.
- Overhead per member: (rollout - work - configured waits) / members, and (rollout - work) /
  members with the waits counted in. It is split exactly by the members' step times: before
  the first turn is held (the receiving member's resolve, fetch, verify, check, headroom, turn),
  inside the turns (the second headroom check, place, record, the time between steps), between
  turns (from one member's `rejoin` done to the next one's `turn` done) and after the last
  turn (its turn given back, its operation done, its heartbeat, the fleet wait's look every
  0.25 s).
- HAProxy: a `RotationRecorder` samples its stats socket every 50 ms: who is not UP, the most
  at once; a member goes DOWN about 0.3 s after its `/readyz` turns 503 and UP 0.3 to 0.6 s
  after it turns 200 again. Clients (`LoadClient`) call through HAProxy from before the API call
  until every member is UP again and 20 more calls answered; every exception counts as failed.
- {where(runs)}
- Targets: overhead at most {TARGET_S:g} s per member beyond the work (and the configured
  waits, which are a setting); 0 failed calls through HAProxy; at most 1 member out of
  rotation at once.

{verdict(runs, problems, unready)}

{table(runs)}
{END}"""


def write_readme(text: str) -> None:
    """Replace the rolling section of bench/README.md, or append it; and its intro row."""
    write_section(text, begin=BEGIN, end=END, script="rolling.py", row=INTRO_ROW)
