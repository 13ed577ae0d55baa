"""The scale bench's report: the table, the verdict against the targets, bench/README.md."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from datetime import datetime

TARGETS = {"cpu_pct": 2.0, "p99_ms": 50.0, "rss_mib": 80.0}
ROWS = [  # key (prefixed new_/old_), label, format
    ("scan_s", "watcher's full scan of the unchanged store, wall (ms)", 1e3, "{:.1f}"),
    ("scan_cpu_s", "watcher's full scan of the unchanged store, CPU (ms)", 1e3, "{:.1f}"),
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
    ("healthz_p50_ms", "control: GET /healthz right after, p50 (ms)", 1.0, "{:.1f}"),
    ("healthz_p99_ms", "control: GET /healthz, p99 (ms)", 1.0, "{:.1f}"),
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


SHARES = [  # key in the floor measurement, what it turns off or slows
    ("overload", "the overload watcher (Triton's /metrics scraped every second)"),
    ("fleet", "the fleet sync (desired state read every poll, a heartbeat every 5 s)"),
    ("reconcile", "the reconcile loop's beat (a pass every 2 s)"),
    ("poll", "the poll (the watcher's beat and the fleet sync's pass, every second)"),
]


def shares_table(shares: dict[str, float]) -> str:
    floor = shares["as it runs"]
    lines = [
        "| turned off, or slowed to once in 300 s | floor then (% of a core) | its share |",
        "|---|---:|---:|",
        f"| nothing (the floor as it runs) | {floor:.2f} | - |",
    ]
    for key, label in SHARES:
        lines.append(f"| {label} | {shares[key]:.2f} | {floor - shares[key]:.2f} |")
    lines.append(
        f"| all four (left: uvicorn's tick, the store's watch, asyncio) | {shares['all']:.2f} "
        f"| {floor - shares['all']:.2f} |"
    )
    return "\n".join(lines)


def rss_text(
    runs: Sequence[dict[str, float]],
    imports: Sequence[tuple[str, float]],
    stubs: Sequence[tuple[str, float]],
    releases: int,
) -> str:
    """What holds the RSS, and what < 80 MiB would take, from what was measured."""
    after_imports = sum(mib for _, mib in imports)
    mine = dict(imports)
    numpy = sum(mib for label, mib in imports if label.startswith(("numpy", "ml_dtypes")))
    same = after_imports - mine["controlplane (settings, wiring, api)"]
    with_stubs = sum(mib for _, mib in stubs)
    floor = _median(runs, "new_floor_rss_mib") or 0.0
    big = _median(runs, "new_rss_mib") or 0.0
    estimate = floor - (same - with_stubs)
    web = mine["pydantic, pydantic-settings, yaml"] + mine["fastapi, starlette"]
    base = mine["interpreter, asyncio, json (the probe itself)"]
    grpc = dict(stubs)["grpc, protobuf"]
    return f"""\
The idle daemon holds {floor:.0f} MiB on a store of one model and {big:.0f} MiB on the big one
(its {releases:,} releases add {big - floor:.0f} MiB); {after_imports:.0f} MiB of it is what its
imports load, the rest threads, the database's cache, gRPC channels, the app, the heap.

{imports_table(imports)}

numpy and ml_dtypes ({numpy:.0f} MiB) come with `tritonclient.grpc`: its package init imports
`tritonclient.utils`, which imports both, and it runs whatever submodule is imported, the
generated stubs (`service_pb2`, `service_pb2_grpc`, `model_config_pb2`) included. Stubs
generated from Triton's `.proto` files at build time would not need it; the same imports with
Triton's messages and stubs built from the protos as tritonclient compiled them:

{imports_table(stubs)}

That is {same - with_stubs:.0f} MiB less than the same imports today ({same:.0f} MiB), so the
daemon would idle near {estimate:.0f} MiB: still above 80. The rest is libraries the daemon is
made of: pydantic and FastAPI ({web:.0f} MiB), grpc and protobuf ({grpc:.0f}), the interpreter
with asyncio and json ({base:.0f}). Below 80 MiB would take generated stubs (the `.proto` files
at build time) and one of: Triton driven over its HTTP API with the httpx already loaded (no
grpc or protobuf), or an API without pydantic and FastAPI."""


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
    stubs: Sequence[tuple[str, float]],
    shares: dict[str, float],
    at: datetime,
) -> str:
    flags = (
        f"--models {args.models} --releases {args.releases} --runs {args.runs} "
        f"--idle {args.idle:g} --requests {args.requests} "
        f"--baseline-requests {args.baseline_requests} --write-readme"
    )
    loads = ", ".join(f"{run['load_1min']:.1f}" for run in runs if "load_1min" in run)
    floor = (
        f"""What the floor is made of (this code, the store of one model, measured once after the
runs, {args.idle:g} s each; each row's share is the floor minus that row):

{shares_table(shares)}

"""
        if shares
        else ""
    )
    return f"""<!-- scale:begin -->
## scale

- Measured: {at:%Y-%m-%d %H:%M} UTC
- Machine: {summary}
- Parameters: a local store of {args.models} models x {args.releases} releases (every one
  published), {args.runs} runs (`.venv/bin/python bench/scale.py {flags}`)
- Baseline: commit `{args.baseline}` (before the scale work), checked out with `git worktree`
  for the run and removed after it; each run measures both, alternating which goes first.
- Scan: the release watcher's full `scan()` of the unchanged store in a child process (local
  store, SQLite releases book, auto-deploy off, no events), median of {args.scans} scans after
  the first. With the store's events a beat lists only the models that changed; a full scan
  runs every `store.full_scan_seconds` (300 s), and on every beat where events cannot be
  trusted (NFS, S3).
- Daemon: `controlplane serve` with `CONTROLPLANE_STORE__POLL_INTERVAL_SECONDS=1` against the
  bundled Triton (no model loaded); {args.settle:g} s after it is ready, its CPU over
  {args.idle:g} s from `/proc/<pid>/stat`, then its `VmRSS`, then {args.requests} sequential
  `GET /v1/models` while the watcher keeps beating (the baseline: {args.baseline_requests}), then
  as many `GET /healthz` (the control: what any request costs then). The floor is the same
  daemon on a store of one model: what it costs with no store to speak of.
- The machine is shared with other work: its 1-minute load average at the end of each run was
  {loads or "-"}.
- Targets: CPU < 2 % of a core, `GET /v1/models` p99 < 50 ms, idle RSS < 80 MiB.

{verdict(runs)}

{table(runs)}

{floor}{rss_text(runs, imports, stubs, args.models * args.releases)}
<!-- scale:end -->"""
