"""The rollback bench's report: the table, the verdict, its section of bench/README.md.

Kept apart from the measuring, as the other benches' reports are. It writes only between its
own markers, plus its one row in the README's intro table.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime

from bench.report import write_section
from tests.support.monitoring import ALERTMANAGER, PROMETHEUS

BEGIN, END = "<!-- rollback:begin -->", "<!-- rollback:end -->"
PATHS = ("watcher", "alert")
INTRO_ROW = (
    "| `rollback.py` | automatic rollback on GPU overload (an exporter serving 0.99), by the "
    "daemon's own watcher and by Prometheus + Alertmanager's webhook, in the same run: time "
    "from the first 0.99 scrape to the fallback answering through the alias, against the "
    "window (10 s) and window + `for` (20 s), where that time goes (detection, the rollback's "
    "`switch` step), and failed requests of clients under load |"
)

ROWS = [  # key, label, format; per-run values, median and spread over runs
    ("watcher_total_s", "watcher: first 0.99 scrape -> r1 answers through the alias (s)", "{:.2f}"),
    ("watcher_overhead_s", "**watcher: reaction overhead = that - 10 s (window) (s)**", "{:.2f}"),
    ("watcher_detect_s", "watcher: first 0.99 scrape -> rollback started (s)", "{:.2f}"),
    ("watcher_record_ms", "watcher: rollback record's duration, `detail.seconds` (ms)", "{:.0f}"),
    ("watcher_switch_ms", "watcher: rollback operation's `switch` step (ms)", "{:.1f}"),
    (
        "watcher_repoint_ms",
        "watcher: of which `repoint_ms`, the alias's `load_model` (ms)",
        "{:.1f}",
    ),
    ("watcher_seen_ms", "watcher: `switch` step done -> poller's first r1 answer (ms)", "{:.0f}"),
    ("alert_total_s", "alert: first 0.99 scrape -> r1 answers through the alias (s)", "{:.2f}"),
    ("alert_overhead_s", "**alert: reaction overhead = that - 20 s (window + for) (s)**", "{:.2f}"),
    (
        "alert_pending_s",
        "alert: first 0.99 scrape -> rule pending (Prometheus `activeAt`) (s)",
        "{:.2f}",
    ),
    ("alert_firing_s", "alert: pending -> firing (the alert's `startsAt`) (s)", "{:.2f}"),
    ("alert_delivery_ms", "alert: firing -> webhook received by the daemon (ms)", "{:.0f}"),
    ("alert_act_ms", "alert: webhook received -> rollback started (ms)", "{:.0f}"),
    ("alert_detect_s", "alert: first 0.99 scrape -> rollback started (s)", "{:.2f}"),
    ("alert_record_ms", "alert: rollback record's duration, `detail.seconds` (ms)", "{:.0f}"),
    ("alert_switch_ms", "alert: rollback operation's `switch` step (ms)", "{:.1f}"),
    ("alert_repoint_ms", "alert: of which `repoint_ms`, the alias's `load_model` (ms)", "{:.1f}"),
    ("alert_seen_ms", "alert: `switch` step done -> poller's first r1 answer (ms)", "{:.0f}"),
    ("ratio", "**ratio alert / watcher, first 0.99 scrape -> r1 answers**", "{:.2f}"),
    (
        "watcher_set_to_scrape_ms",
        "watcher: exporter set to 0.99 -> its first scrape (ms)",
        "{:.0f}",
    ),
    (
        "alert_sampled_ms",
        "alert: Prometheus's own timestamp of its first 0.99 sample - first 0.99 scrape (ms)",
        "{:.1f}",
    ),
    ("alert_set_to_scrape_ms", "alert: exporter set to 0.99 -> its first scrape (ms)", "{:.0f}"),
]
COUNTS = [  # (suffix, label), per path
    ("requests", "load clients' requests"),
    ("failed", "failed requests (any exception)"),
    ("polls", "poller's requests"),
    ("poll_failed", "poller's failed requests"),
    ("back", "r2 answers after the same client had an r1 answer"),
    ("unexpected", "answers matching neither release"),
    ("raced", "onsets where a scrape raced the exporter's set() (timed from set())"),
]
BAD = ("failed", "poll_failed", "back", "unexpected")


def _median(runs: Sequence[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def _total(runs: Sequence[dict[str, float]], keys: Sequence[str]) -> float:
    return sum(run[f"{path}_{key}"] for run in runs for path in PATHS for key in keys)


def table(runs: Sequence[dict[str, float]]) -> str:
    numbers = " | ".join(f"run {i}" for i in range(1, len(runs) + 1))
    lines = [
        f"| metric | median over runs | spread (max - min) | {numbers} |",
        "|---|" + "---:|" * (len(runs) + 2),
    ]
    for key, label, fmt in ROWS:
        values = [run[key] for run in runs]
        spread = max(values) - min(values)
        cells = [fmt.format(v) for v in (statistics.median(values), spread, *values)]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    lines += ["", "| count (total over runs) | watcher | alert |", "|---|---:|---:|"]
    for key, label in COUNTS:
        cells = [f"{sum(run[f'{path}_{key}'] for run in runs):.0f}" for path in PATHS]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    return "\n".join(lines)


def verdict(runs: Sequence[dict[str, float]]) -> str:
    bad = _total(runs, BAD)
    requests = _total(runs, ("requests", "polls"))

    def spread(key: str, fmt: str = "{:.2f}") -> str:
        values = [run[key] for run in runs]
        low, high = fmt.format(min(values)), fmt.format(max(values))
        return fmt.format(statistics.median(values)) + (
            "" if low == high else f" ({low} to {high})"
        )

    return (
        f"Result: 0 failed requests: **{'met' if bad == 0 else 'missed'}** ({bad:.0f} failed or "
        f"wrong of {requests:.0f}). With the daemon's own watcher, r1 answered through the alias "
        f"{spread('watcher_total_s')} s after the first 0.99 scrape: "
        f"{spread('watcher_overhead_s')} s over the 10 s window, of which detection (to the "
        f"rollback's start) took {_median(runs, 'watcher_detect_s') - 10:.2f} s beyond the "
        f"window and the rollback {_median(runs, 'watcher_record_ms'):.0f} ms (`switch` step "
        f"{_median(runs, 'watcher_switch_ms'):.0f} ms). Through Prometheus and Alertmanager it "
        f"took {spread('alert_total_s')} s: {spread('alert_overhead_s')} s against window + "
        f"for = 20 s; the rule went pending {_median(runs, 'alert_pending_s'):.2f} s after the "
        f"onset and fired {_median(runs, 'alert_firing_s'):.2f} s later, the webhook reached "
        f"the daemon {_median(runs, 'alert_delivery_ms'):.0f} ms after that, and the rollback "
        f"took {_median(runs, 'alert_record_ms'):.0f} ms (`switch` step "
        f"{_median(runs, 'alert_switch_ms'):.0f} ms). Ratio alert / watcher "
        f"{spread('ratio')}. On both paths the time is detection: the rollback itself, a "
        "re-point to the warm r1 slot, is a few tens of ms."
    )


def monitors() -> str:
    """Prometheus's and Alertmanager's versions, for the machine line."""
    found = []
    for name, binary in (("Prometheus", PROMETHEUS), ("Alertmanager", ALERTMANAGER)):
        try:
            out = subprocess.run(
                [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
            )
            words = (out.stdout + out.stderr).split()
            found.append(f"{name} {words[words.index('version') + 1]}")
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            found.append(f"{name} (version unknown)")
    return ", ".join(found)


def section(args: argparse.Namespace, summary: str, runs: Sequence[dict[str, float]]) -> str:
    flags = f"--runs {args.runs} --clients {args.clients} --poll {args.poll:g} --write-readme"
    if args.quick:
        flags = "--quick --write-readme"
    runs_ = f"{args.runs} run{'' if args.runs == 1 else 's'}"
    n, poll = args.clients, f"{args.poll * 1e3:.0f} ms"
    return f"""{BEGIN}
## rollback

Smoke run (~1 min): `.venv/bin/python bench/rollback.py --quick`.

- Measured: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC
- Machine: {summary}, {monitors()}
- Parameters: {runs_}, each timing both paths, which take turns going first; {n} load
  clients; the poller asks every {poll} (`.venv/bin/python bench/rollback.py {flags}`)
- Model: per run and path a fresh daemon and model (`rb-watch-<run>`, `rb-alert-<run>`): r1
  (`OUTPUT0 = INPUT0 * 1`) deployed, then r2 (`* 2`), strategy `blue-green` with
  `retire_after_seconds: 3600`, so r1's slot stays warm and the rollback is a pure re-point of
  the alias. One Triton for everything; each model is unloaded after its run.
- Paths: `watcher` is the daemon with `rollback: {{source: triton, metrics_url: <exporter>,
  window_seconds: 10, interval_seconds: 1}}`. `alert` is the daemon with `rollback: {{source:
  none}}` and an API token, Prometheus (scrape and evaluation every 1 s) with
  `avg_over_time(nv_gpu_utilization[10s]) > 0.95`, `for: 10s`, and Alertmanager (`group_wait:
  0s`) posting the webhook `POST /v1/alerts` with that token as a bearer token.
- Onset: each path has its own exporter (the tests' `GpuExporter`) serving 0.30 until the
  daemon reports `healthy` (watcher) or Prometheus has scraped it (alert); then 0.99, set at a
  random point between two scrapes. The clock starts at the exporter's first scrape after
  that (its scrape count polled every 0.5 ms); Prometheus's own timestamp of that sample
  agrees within a few ms (a row below).
- End: the end of the first request that r1 answered, from one gRPC client polling the alias
  every {poll}. Meanwhile {n} more clients send inference back to back and count every
  failure.
- Split: the rollback record's start (`at`) and `detail.seconds`, its operation's `switch`
  step (with `repoint_ms`), and on the alert path Prometheus's `activeAt`, the alert's
  `startsAt` and the daemon's `first_received`, all from the daemon's and Prometheus's APIs;
  their wall-clock times are put on the bench's clock (one host). The `switch` step ends after
  its own check inference through the alias, so the poller can see r1 a few ms before the step
  ends (a negative value).
- Why the watcher takes the window and no more: a breach needs a sample at or before the
  window's start and every sample since above the line. Samples are stamped with the watcher's
  1 s beat, not with when the loop woke up or the scrape answered, so the first 0.99 sample
  opens a full window exactly 10 beats later. (Before that fix the evaluator also weighed older
  samples, and scrape latency decided between 10, 11 and 12 s.)
- Why the alert path can beat window + for: one 0.30 sample among ten 0.99 averages 0.92, so
  the rule holds once the last 0.30 sample, scraped 1 s before the first 0.99, leaves the 10 s
  range: 9 s after the onset, at the next evaluation (+0 to 1 s, the evaluation's phase
  against the scrapes); `for: 10s` then adds exactly 10 s. Its floor is 19 s plus that phase,
  so its overhead against 20 s is near zero or negative.
- Targets: 0 failed requests and 0 answers from r2 after the same client had one from r1.
  Times: none; reported against the floors above.

{verdict(runs)}

{table(runs)}
{END}"""


def write_readme(text: str) -> None:
    """Replace the rollback section of bench/README.md, or append it; and its intro row."""
    write_section(text, begin=BEGIN, end=END, script="rollback.py", row=INTRO_ROW)
