"""The scale bench's report: the table, the verdict against the targets, bench/README.md."""

from __future__ import annotations

import argparse
import statistics
import textwrap
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


def imports_table(imports: dict[str, Sequence[tuple[str, float]]]) -> str:
    """RSS each group of imports adds, now and before the RSS work, rows in the order the
    daemon imports them (a package only one of them loads has a dash in the other column)."""
    now, before = dict(imports["now"]), dict(imports["before"])
    labels = [label for label, _ in imports["now"]]
    for at, (label, _) in enumerate(imports["before"]):
        if label not in now:  # where the code before loaded it, among the rows both have
            labels.insert(min(at, len(labels) - 3), label)
    lines = [
        "| loaded by `controlplane serve` | now: RSS it adds (MiB) | before the RSS work |",
        "|---|---:|---:|",
    ]
    for label in labels:
        cells = [f"{col[label]:.1f}" if label in col else "-" for col in (now, before)]
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    totals = [sum(col.values()) for col in (now, before)]
    lines.append(f"| total | {totals[0]:.0f} | {totals[1]:.0f} |")
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


RSS_ROWS = [  # prefix of the keys in the runs, label
    ("new", "this code"),
    ("rss", "the code before the RSS work (`{rss}`), same venv"),
    ("image", "this code in a venv of its runtime dependencies only (as the image)"),
    ("old", "the scale baseline (`{old}`)"),
    ("new_floor", "this code, store of 1 model"),
]


def rss_table(runs: Sequence[dict[str, float]], args: argparse.Namespace) -> str:
    lines = [
        "| idle, median over runs (MiB) | VmRSS | of it anonymous (RssAnon) | VmRSS, runs |",
        "|---|---:|---:|---|",
    ]
    for prefix, label in RSS_ROWS:
        rss, anon = _median(runs, f"{prefix}_rss_mib"), _median(runs, f"{prefix}_anon_mib")
        if rss is None:
            continue
        spread = ", ".join(_cell(run.get(f"{prefix}_rss_mib"), 1.0, "{:.0f}") for run in runs)
        name = label.format(rss=args.rss_baseline, old=args.baseline)
        lines.append(f"| {name} | {rss:.0f} | {_cell(anon, 1.0, '{:.0f}')} | {spread} |")
    return "\n".join(lines)


def _paragraphs(*texts: str) -> str:
    return "\n\n".join(
        textwrap.fill(" ".join(text.split()), 96, break_on_hyphens=False) for text in texts
    )


def _row(imports: Sequence[tuple[str, float]], prefix: str) -> float:
    return sum(mib for label, mib in imports if label.startswith(prefix))


def rss_text(
    runs: Sequence[dict[str, float]],
    imports: dict[str, Sequence[tuple[str, float]]],
    args: argparse.Namespace,
) -> str:
    """What holds the RSS, what the RSS work took out, and what < 80 MiB would take, from what
    was measured."""
    now, before = imports["now"], imports["before"]
    big = _median(runs, "new_rss_mib") or 0.0
    anon = _median(runs, "new_anon_mib") or 0.0
    floor = _median(runs, "new_floor_rss_mib") or 0.0
    was, was_anon = _median(runs, "rss_rss_mib"), _median(runs, "rss_anon_mib")
    image = _median(runs, "image_rss_mib")
    after = sum(mib for _, mib in now)
    labels = {label for label, _ in now}
    gone = sorted(
        label
        for label, _ in before
        if label not in labels and not label.startswith(("other", "standard"))
    )
    took = sum(mib for label, mib in before if label in gone)
    rich = _row(now, "rich")
    grpc = _row(now, "grpc") + _row(now, "protobuf")
    head = f"Idle RSS on the {args.models} x {args.releases} store: **{big:.0f} MiB** now"
    if was is not None:
        head += (
            f", against **{was:.0f} MiB** for the code before the RSS work in the same runs "
            f"({big - was:+.0f} MiB; anonymous memory {anon:.0f} against {was_anon or 0:.0f})."
        )
    else:
        head += "."
    if image is not None:
        head += (
            f" Installed as the image installs it (its runtime dependencies only) it idles at "
            f"{image:.0f} MiB: in the dev venv the test tools bring trio and attrs, which "
            "httpcore imports when they are there."
        )
    head += (
        f" On a store of one model it idles at {floor:.0f} MiB: the watcher's state for "
        f"{args.models * args.releases:,} releases is the other {big - floor:.0f} MiB. VmRSS "
        f"also counts the pages of the shared libraries the daemon maps ({big - anon:.0f} MiB "
        "here: grpc's, libpython's, OpenSSL's, pydantic-core's...) as far as the page cache "
        "holds them, which other work on the machine changes: only figures of the same run "
        "compare."
    )
    gone_text = (
        f"The RSS work took {', '.join(gone) or 'nothing'} out of the imports ({took:.0f} MiB): "
        "the Triton adapter speaks gRPC with Triton's messages and service generated at build "
        "time from tritonclient's protos (tritonclient's package init imports numpy and ml_dtypes "
        "whatever submodule is asked for), cryptography is imported when a keyring is "
        "configured (boto3 already was only with an S3 store), the metrics reader gives httpx no "
        "TLS context for a plain-HTTP endpoint, and uvicorn loads no WebSocket protocol."
    )
    left = (
        f"What is left is the libraries the daemon is made of, {after:.0f} MiB after imports "
        f"(the interpreter with asyncio and json {_row(now, 'interpreter'):.0f}, pydantic and "
        f"FastAPI {_row(now, 'pydantic') + _row(now, 'fastapi'):.0f}, grpc and protobuf "
        f"{grpc:.0f}, the daemon's own modules {_row(now, 'controlplane'):.0f}, httpx with "
        f"httpcore {_row(now, 'httpx') + _row(now, 'httpcore'):.0f}, rich and pygments "
        f"{rich:.0f}), then {floor - after:.0f} MiB of run-time state on a store of one model "
        "(threads' stacks and malloc arenas, gRPC's channels and event engine, SQLite's page "
        f"cache, the app) and the store's {big - floor:.0f}."
    )
    target = image if image is not None else big
    need, store = target - 80, big - floor
    take = (
        f"Below 80 MiB as the image installs it ({need:.0f} MiB less) the one change that would "
        "get there is Triton driven over its HTTP API with the httpx already loaded: no grpc at "
        f"run time ({grpc:.0f} MiB of imports, and its channels and threads), protobuf imported "
        "only to verify a release's config.pbtxt. The other pieces together come short "
        f"({store + rich:.0f} of {need:.0f} MiB): the watcher's state per release ({store:.0f} "
        f"MiB at {args.models * args.releases:,} releases) and rich and pygments ({rich:.0f} "
        "MiB: httpx's package init imports its command-line client whenever they are installed, "
        "and typer requires rich). An API without pydantic and FastAPI would also do it; the "
        "daemon is built on them."
    )
    return f"""\
{_paragraphs(head)}

{rss_table(runs, args)}

What the imports hold, now and before the RSS work: each group in a fresh process, in the
daemon's order; the rows after the shared libraries are the packages `controlplane serve`'s own
modules import, each without the packages it imports in turn; the last row is what the daemon's
first HTTP client loads.

{imports_table(imports)}

{_paragraphs(gone_text, left, take)}"""


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
        was = _median(runs, "rss_rss_mib") if key == "rss_mib" else None
        before = "" if was is None else f", before the RSS work {was:.1f}"
        parts.append(f"{what}: **{met}** ({new:.1f}{before}, baseline {old:.1f})")
    return "Result: " + "; ".join(parts) + "."


def section(
    args: argparse.Namespace,
    summary: str,
    runs: Sequence[dict[str, float]],
    imports: dict[str, Sequence[tuple[str, float]]],
    shares: dict[str, float],
    at: datetime,
) -> str:
    flags = (
        f"--models {args.models} --releases {args.releases} --runs {args.runs} "
        f"--idle {args.idle:g} --requests {args.requests} "
        f"--baseline-requests {args.baseline_requests} --rss-baseline {args.rss_baseline}"
        f"{' --no-image' if args.no_image else ''} --write-readme"
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
  daemon on a store of one model: what it costs with no store to speak of. Idle RSS only, after
  the same wait, on the big store: the code before the RSS work (commit `{args.rss_baseline}`,
  another `git worktree`, same venv) and this code installed with `pip install -c
  constraints.txt .` in a venv of its own (its runtime dependencies only, as the image has
  them); in the dev venv the test tools install libraries the daemon picks up (trio, which
  httpcore imports when it is there, comes with selenium).
- The machine is shared with other work: its 1-minute load average at the end of each run was
  {loads or "-"}.
- Targets: CPU < 2 % of a core, `GET /v1/models` p99 < 50 ms, idle RSS < 80 MiB.

{verdict(runs)}

{table(runs)}

{floor}{rss_text(runs, imports, args)}
<!-- scale:end -->"""
