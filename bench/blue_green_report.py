"""The blue_green bench's report: the table, the verdict, its section of bench/README.md.

Kept apart from the measuring, as `report.py` is for hot_swap, so that what is measured and how
it is judged can be read (and changed) separately. It writes only between its own markers, plus
its one row in the README's intro table.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from datetime import UTC, datetime

from bench.report import write_section

BEGIN, END = "<!-- blue_green:begin -->", "<!-- blue_green:end -->"
SLOW_REPOINT_MS = 100.0  # above this a re-point reloaded a composing slot (Triton: ~1.3 s)
INTRO_ROW = (
    "| `blue_green.py` | N clients send gRPC inference to a blue-green model's alias while the "
    "daemon switches it K times by deploy and K times by rollback inside the retire window "
    "(a pure re-point): failed requests, answers that go back to an older release, the `switch` "
    "step and its `repoint_ms` against the whole deploy, and the alias's latency against calling "
    "the active slot directly, measured alternately in the same run |"
)

ROWS = [  # key, label, format; per-run values, then median over runs
    ("deploy_wall_ms", "deploy through the daemon, wall, median (ms)", "{:.0f}"),
    ("deploy_wall_p99_ms", "deploy through the daemon, wall, p99 (ms)", "{:.0f}"),
    ("deploy_free_ms", "deploy: `free` step (unload the old retiring slot), median (ms)", "{:.0f}"),
    ("deploy_load_ms", "deploy: `load` step (the idle slot), median (ms)", "{:.0f}"),
    ("deploy_preflight_ms", "deploy: `preflight` step, median (ms)", "{:.1f}"),
    ("deploy_switch_ms", "deploy: `switch` step, median (ms)", "{:.1f}"),
    ("deploy_switch_p99_ms", "deploy: `switch` step, p99 (ms)", "{:.1f}"),
    ("deploy_repoint_ms", "deploy: `repoint_ms` (alias `load_model`), median (ms)", "{:.1f}"),
    ("deploy_repoint_p99_ms", "deploy: `repoint_ms`, p99 (ms)", "{:.1f}"),
    ("rollback_wall_ms", "rollback (re-point), wall, median (ms)", "{:.1f}"),
    ("rollback_wall_p99_ms", "rollback (re-point), wall, p99 (ms)", "{:.1f}"),
    ("rollback_switch_ms", "rollback: `switch` step, median (ms)", "{:.1f}"),
    ("rollback_switch_p99_ms", "rollback: `switch` step, p99 (ms)", "{:.1f}"),
    ("rollback_repoint_ms", "rollback: `repoint_ms`, median (ms)", "{:.1f}"),
    ("rollback_repoint_p99_ms", "rollback: `repoint_ms`, p99 (ms)", "{:.1f}"),
    ("p50_idle_ms", "latency p50, alias, requests overlapping no switch (ms)", "{:.2f}"),
    ("p99_idle_ms", "latency p99, alias, requests overlapping no switch (ms)", "{:.2f}"),
    ("p50_deploy_ms", "latency p50, alias, requests overlapping a deploy (ms)", "{:.2f}"),
    ("p99_deploy_ms", "latency p99, alias, requests overlapping a deploy (ms)", "{:.2f}"),
    ("p50_rollback_ms", "latency p50, alias, requests overlapping a rollback (ms)", "{:.2f}"),
    ("p99_rollback_ms", "latency p99, alias, requests overlapping a rollback (ms)", "{:.2f}"),
    ("one_alias_p50_ms", "1 client: alias p50 (ms)", "{:.3f}"),
    ("one_direct_p50_ms", "1 client: active slot directly p50 (ms)", "{:.3f}"),
    ("one_ratio_p50", "**1 client: ratio alias / direct, p50**", "{:.2f}"),
    ("one_alias_p99_ms", "1 client: alias p99 (ms)", "{:.3f}"),
    ("one_direct_p99_ms", "1 client: active slot directly p99 (ms)", "{:.3f}"),
    ("one_ratio_p99", "**1 client: ratio alias / direct, p99**", "{:.2f}"),
    ("many_alias_p50_ms", "N clients: alias p50 (ms)", "{:.3f}"),
    ("many_direct_p50_ms", "N clients: active slot directly p50 (ms)", "{:.3f}"),
    ("many_ratio_p50", "**N clients: ratio alias / direct, p50**", "{:.2f}"),
    ("many_alias_p99_ms", "N clients: alias p99 (ms)", "{:.3f}"),
    ("many_direct_p99_ms", "N clients: active slot directly p99 (ms)", "{:.3f}"),
    ("many_ratio_p99", "**N clients: ratio alias / direct, p99**", "{:.2f}"),
]
COUNTS = [
    ("requests", "inference requests to the alias during switches"),
    ("failed", "failed requests during switches (any exception)"),
    ("out_of_order", "answers that go back to an older release after a newer one, per client"),
    ("stale", "answers from a release not serving while the request ran (e.g. after the switch)"),
    ("unexpected", "answers matching no release"),
    ("overhead_requests", "inference requests in the alias overhead phase"),
    ("overhead_failed", "failed or wrong answers in the alias overhead phase"),
    ("repoints", "re-points (deploys + rollbacks)"),
    ("slow_repoints", f"re-points over {SLOW_REPOINT_MS:.0f} ms (a composing slot reloaded)"),
]
BAD = ("failed", "out_of_order", "stale", "unexpected", "overhead_failed")


def _median(runs: Sequence[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def table(runs: Sequence[dict[str, float]]) -> str:
    lines = ["| metric | median over runs | min run | max run |", "|---|---:|---:|---:|"]
    for key, label, fmt in ROWS:
        values = [run[key] for run in runs]
        cells = [fmt.format(v) for v in (statistics.median(values), min(values), max(values))]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    lines += ["", "| count (total over runs) | value |", "|---|---:|"]
    lines += [f"| {label} | {sum(run[key] for run in runs):.0f} |" for key, label in COUNTS]
    return "\n".join(lines)


def verdict(runs: Sequence[dict[str, float]], clients: int) -> str:
    bad = sum(run[key] for run in runs for key in BAD)
    slow = sum(run["slow_repoints"] for run in runs)
    repoints = sum(run["repoints"] for run in runs)
    worst = max(run["repoint_max_ms"] for run in runs)

    def ratios(prefix: str) -> str:
        p50 = _median(runs, f"{prefix}_ratio_p50")
        p99 = _median(runs, f"{prefix}_ratio_p99")
        extra = _median(runs, f"{prefix}_alias_p50_ms") - _median(runs, f"{prefix}_direct_p50_ms")
        return f"p50 x{p50:.2f} ({extra * 1e3:+.0f} us), p99 x{p99:.2f}"

    return (
        f"Result: 0 failed requests: **{'met' if bad == 0 else 'missed'}** ({bad:.0f} failed, "
        "out-of-order, stale, unexpected or wrong answers). Re-point (the alias's "
        f"`load_model`): median {_median(runs, 'deploy_repoint_ms'):.1f} ms in deploys, "
        f"{_median(runs, 'rollback_repoint_ms'):.1f} ms in rollbacks, at most {worst:.1f} ms; "
        f"{slow:.0f} of {repoints:.0f} over {SLOW_REPOINT_MS:.0f} ms. A rollback inside the "
        f"retire window took {_median(runs, 'rollback_wall_ms'):.0f} ms against "
        f"{_median(runs, 'deploy_wall_ms'):.0f} ms for a deploy. Alias against the active slot "
        f"directly (median over runs): 1 client {ratios('one')}; {clients} clients "
        f"{ratios('many')}."
    )


def section(args: argparse.Namespace, summary: str, runs: Sequence[dict[str, float]]) -> str:
    flags = (
        f"--clients {args.clients} --switches {args.switches} --runs {args.runs} "
        f"--batch {args.batch} --batches {args.batches} --write-readme"
    )
    if args.quick:
        flags = "--quick --write-readme"
    runs_, k, n = args.runs, args.switches, args.clients
    return f"""{BEGIN}
## blue_green

- Measured: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC
- Machine: {summary}
- Parameters: {runs_} runs of {k} deploys and {k} rollbacks each under {n} clients; alias
  overhead in {args.batches} alternating batch pairs of {args.batch} requests per client, with
  1 client, then {n} (`.venv/bin/python bench/blue_green.py {flags}`)
- Model: Python backend, `OUTPUT0 = INPUT0 * k`, one CPU instance per slot; strategy
  `blue-green` with `retire_after_seconds: {args.retire_after:.0f}`: longer than a run, so no
  retire (drain, unload) runs beside a measured switch and every rollback lands inside the
  retire window. Each deploy therefore frees the other slot first (the `free` step unloads the
  release it held and waits for UNAVAILABLE), then loads, preflights and switches.
- Switches: each run deploys r0 (not measured), then r1..rK (one release per deploy, each with
  its own `k`, so every answer names its release), then K rollbacks, which go back and forth
  between rK-1 and rK by re-pointing the alias only. `repoint_ms` is the daemon's own timing of
  the alias's `load_model`; the `switch` step adds reading the configs and one inference
  through the alias. p99 over the K switches of one run is about their maximum.
- Order: each client's answers must only move to the release of a later switch: an answer from
  a release that was not serving at any time while the request ran counts as stale (a switch
  is "serving" from the start of its HTTP call to the end of the next one's).
- Alias overhead: no switch running and no other load; each client alternates batches to the
  alias and to the active slot (`<model>__blue` or `__green`) on one gRPC channel, half of the
  clients starting with each, so both targets share the same load. Targets: none; reported.
- Not measured by the bench, checked once by hand on the same machine: a re-point takes
  ~1.45 s instead of a few ms when the target slot's files are newer than its last load
  (Triton reloads the composing slot), e.g. after touching the warm slot's `1/model.py`
  before a rollback. Touching the source alone costs two slow re-points to that slot: the
  reload makes the Python stub rewrite the now stale `__pycache__`, which again looks like a
  change at the next re-point; then it is fast again. The staged byte-compile keeps the
  counted re-points below fast (0 over {SLOW_REPOINT_MS:.0f} ms is the check).
- Targets: 0 failed requests, 0 answers going back, 0 stale.

{verdict(runs, args.clients)}

{table(runs)}
{END}"""


def write_readme(text: str) -> None:
    """Replace the blue_green section of bench/README.md, or append it; and its intro row."""
    write_section(text, begin=BEGIN, end=END, script="blue_green.py", row=INTRO_ROW)
