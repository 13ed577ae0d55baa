"""The scale bench's report: the table, the verdict against the targets, bench/README.md."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from datetime import datetime

TARGETS = {"cpu_pct": 2.0, "p99_ms": 50.0, "rss_mib": 80.0}
ROWS = [  # key (prefixed new_/old_), label, format
    ("scan_s", "watcher scan of the unchanged store, wall (ms)", 1e3, "{:.1f}"),
    ("scan_cpu_s", "watcher scan of the unchanged store, CPU (ms)", 1e3, "{:.1f}"),
    (
        "first_scan_s",
        "first scan after a start (every marker hashed, every row written) (s)",
        1.0,
        "{:.2f}",
    ),
    ("cpu_pct", "daemon CPU, idle at a 1 s poll (% of a core)", 1.0, "{:.1f}"),
    ("floor_cpu_pct", "same daemon on a store of 1 model: the floor (% of a core)", 1.0, "{:.1f}"),
    ("rss_mib", "daemon RSS, idle (MiB)", 1.0, "{:.0f}"),
    ("floor_rss_mib", "same daemon on a store of 1 model (MiB)", 1.0, "{:.0f}"),
    ("p50_ms", "GET /v1/models, default answer, p50 (ms)", 1.0, "{:.1f}"),
    ("p99_ms", "GET /v1/models, default answer, p99 (ms)", 1.0, "{:.1f}"),
    ("answered", "models in the default answer", 1.0, "{:.0f}"),
    (
        "all_p50_ms",
        "GET /v1/models?limit=<all>, whole store in one answer, p50 (ms)",
        1.0,
        "{:.1f}",
    ),
    ("all_p99_ms", "GET /v1/models?limit=<all>, p99 (ms)", 1.0, "{:.1f}"),
]


def _median(runs: Sequence[dict[str, float]], key: str) -> float | None:
    values = [run[key] for run in runs if key in run]
    return statistics.median(values) if values else None


def _cell(value: float | None, scale: float, fmt: str) -> str:
    return "-" if value is None else fmt.format(value * scale)


def table(runs: Sequence[dict[str, float]]) -> str:
    lines = [
        "| metric | now (median) | baseline (median) | ratio now / baseline | now: runs |",
        "|---|---:|---:|---:|---|",
    ]
    for key, label, scale, fmt in ROWS:
        new, old = _median(runs, f"new_{key}"), _median(runs, f"old_{key}")
        ratio = "-" if new is None or not old else f"{new / old:.3f}"
        spread = ", ".join(_cell(run.get(f"new_{key}"), scale, fmt) for run in runs)
        lines.append(
            f"| {label} | {_cell(new, scale, fmt)} | {_cell(old, scale, fmt)} | {ratio} | "
            f"{spread} |"
        )
    return "\n".join(lines)


def imports_table(imports: Sequence[tuple[str, float]]) -> str:
    lines = ["| loaded by `controlplane serve` | RSS it adds (MiB) |", "|---|---:|"]
    lines += [f"| {label} | {mib:.1f} |" for label, mib in imports]
    lines.append(f"| total after imports | {sum(mib for _, mib in imports):.0f} |")
    return "\n".join(lines)


def verdict(runs: Sequence[dict[str, float]]) -> str:
    parts = []
    for key, what in (
        ("cpu_pct", "CPU < 2 % of a core"),
        ("p99_ms", "p99 < 50 ms"),
        ("rss_mib", "idle RSS < 80 MiB"),
    ):
        new, old = _median(runs, f"new_{key}"), _median(runs, f"old_{key}")
        if new is None or old is None:
            continue
        met = "met" if new < TARGETS[key] else "missed"
        parts.append(f"{what}: **{met}** ({new:.1f}, baseline {old:.1f})")
    return "Result: " + "; ".join(parts) + "."


def section(
    args: argparse.Namespace,
    summary: str,
    runs: Sequence[dict[str, float]],
    imports: Sequence[tuple[str, float]],
    at: datetime,
) -> str:
    flags = (
        f"--models {args.models} --releases {args.releases} --runs {args.runs} "
        f"--idle {args.idle:g} --requests {args.requests} --write-readme"
    )
    return f"""<!-- scale:begin -->
## scale

- Measured: {at:%Y-%m-%d %H:%M} UTC
- Machine: {summary}
- Parameters: a local store of {args.models} models x {args.releases} releases (every one
  published), {args.runs} runs (`.venv/bin/python bench/scale.py {flags}`)
- Baseline: commit `{args.baseline}` (before the scale work), checked out with `git worktree`
  for the run and removed after it; each run measures both, alternating which goes first.
- Scan: the release watcher's `scan()` of the unchanged store in a child process (local store,
  SQLite releases book, auto-deploy off), median of {args.scans} scans after the first.
- Daemon: `controlplane serve` with `CONTROLPLANE_STORE__POLL_INTERVAL_SECONDS=1` against the
  bundled Triton (no model loaded); {args.settle:g} s after it is ready, its CPU over
  {args.idle:g} s from `/proc/<pid>/stat`, then its `VmRSS`, then {args.requests} sequential
  `GET /v1/models` while the watcher keeps beating. The floor is the same daemon on a store of
  one model: what it costs with no store to speak of (the reconcile loop looks at Triton's
  index 4 times a second, the overload watcher scrapes Triton's metrics every second).
- Targets: CPU < 2 % of a core, `GET /v1/models` p99 < 50 ms, idle RSS < 80 MiB.

{verdict(runs)}

{table(runs)}

What holds the RSS (this code, one process importing what the daemon imports, in order):

{imports_table(imports)}
<!-- scale:end -->"""
