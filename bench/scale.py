"""Scale: what a beat of the release watcher and GET /v1/models cost on a big local store.

Every member of a fleet lists the store on every beat, so a beat must cost what changed, not
what the store holds. This bench builds a local store of M models x R releases (default
200 x 20, all published) and measures, for the code as it is and for a baseline commit (by
default the one before the scale work) checked out with ``git worktree`` in the same run:

* the watcher's scan of the unchanged store, in a child process (``bench/scale_probe.py``):
  wall and CPU time of one full scan (what every beat was before the store's events named the
  models that changed; now what the safety-net scan every ``store.full_scan_seconds`` costs),
  median over ``--scans`` scans after the first;
* ``controlplane serve`` at ``store.poll_interval_seconds: 1`` against the bundled Triton
  (CPU): its CPU over ``--idle`` s from ``/proc/<pid>/stat`` (nothing else happening), then
  its RSS (``VmRSS``);
* ``GET /v1/models``: ``--requests`` sequential calls while the watcher keeps beating (the
  baseline, whose answer took seconds, ``--baseline-requests``), p50 and p99; the default
  answer (the baseline: every model; now: the first page of 100) and, for the code under
  test, ``?limit=M`` too (the whole store in one page, the baseline's content). ``GET
  /healthz`` as many times right after is the control: what any request costs on this machine
  at that moment (it is shared: the 1-minute load average at the end of each run is reported).

Idle RSS is also measured, in each run, for the code before the RSS work (``--rss-baseline``,
another ``git worktree``) and for this code installed in a venv of the runtime dependencies only
(what the image installs: no test tools, which bring libraries the daemon may pick up, such as
trio), both on the big store after the same wait; and the RSS each group of imports adds, for
this code and the code before the RSS work (``bench/scale_probe.py imports``).

The same daemon measured on a store of one model gives the floor that has nothing to do with
the store. Once, after the runs, the code under test's floor is measured again with each of its
background jobs turned off or slowed to once in 300 s, so that each one's share shows.
Runs alternate which code goes first.

Run from the repo root: ``.venv/bin/python bench/scale.py [--quick] [--write-readme]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.hot_swap import cache_dir
from bench.report import machine, run_main, write_section
from bench.scale_report import section
from devtools.launcher import RunningTriton, launch_triton
from tests.support.daemon import start_daemon
from tests.support.models import write_scale_release

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "92ab479"  # the last commit before the scale work
RSS_BASELINE = "5836798"  # the last commit before the RSS work (Triton's protocol generated)
BEGIN, END = "<!-- scale:begin -->", "<!-- scale:end -->"
TICK = os.sysconf("SC_CLK_TCK")
INTRO_ROW = (
    "| `scale.py` | a 200 x 20 local store, this code against the commit before the scale work "
    "(a `git worktree`) in the same run: the watcher's full scan of the unchanged store, the "
    "daemon's CPU at a 1 s poll (and each background job's share of its floor) and its idle "
    "RSS (and what holds it, against the code before the RSS work and as the image installs "
    "it), `GET /v1/models` p50/p99 |"
)


def build_store(root: Path, models: int, releases: int) -> Path:
    for m in range(models):
        for r in range(1, releases + 1):
            write_scale_release(root, f"m{m:03d}", f"r{r}", k=float(r))
    return root


@contextlib.contextmanager
def baseline_tree(commit: str, where: Path) -> Iterator[Path]:
    """The baseline commit checked out beside the bench's temp files; removed afterwards."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), commit],
        check=True,
        capture_output=True,
    )
    try:
        yield where
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)],
            check=False,
            capture_output=True,
        )


def code_env(tree: Path) -> dict[str, str]:
    """The environment that makes ``python -m controlplane`` run the code in ``tree``."""
    return {**os.environ, "PYTHONPATH": str(tree)}


def runtime_venv(where: Path) -> Path:
    """A venv with this code and its runtime dependencies only, at the pinned versions, as the
    image installs them; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, capture_output=True)
    python = where / "bin" / "python"
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "-c",
            str(ROOT / "constraints.txt"),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    return python


def probe(tree: Path, *args: str) -> Any:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scale_probe.py"), *args],
        env=code_env(tree),
        check=True,
        capture_output=True,
        text=True,
        cwd=tree,
    )
    return json.loads(out.stdout)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def memory(pid: int) -> dict[str, float]:
    """VmRSS, and of it the anonymous pages (RssAnon: the process's own; the rest is files
    mapped in, shared libraries' code mostly, counted as far as the page cache holds them)."""
    fields = {"VmRSS:": "rss_mib", "RssAnon:": "anon_mib"}
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, *value = line.split()
        if name in fields:
            out[fields[name]] = int(value[0]) / 1024
    return out


def latencies(get: Any, path: str, count: int) -> tuple[float, float, int]:
    """p50 and p99 (ms) of ``count`` sequential GETs of ``path``, and the models answered."""
    times, answered = [], 0
    for _ in range(count):
        start = time.perf_counter()
        response = get(path)
        times.append((time.perf_counter() - start) * 1e3)
        response.raise_for_status()
        answered = len(response.json().get("models", []))
    cuts = statistics.quantiles(times, n=100, method="inclusive")
    return cuts[49], cuts[98], answered


def idle_cpu(pid: int, seconds: float) -> float:
    """The process's CPU over ``seconds``, in % of a core."""
    cpu, wall = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return 100 * (cpu_seconds(pid) - cpu) / (time.monotonic() - wall)


def idle_rss(
    tree: Path | None,
    triton: RunningTriton,
    store: Path,
    work: Path,
    args: argparse.Namespace,
    python: Path | None = None,
) -> dict[str, float]:
    """The idle RSS of the code in ``tree`` (or installed in ``python``'s venv), after the same
    wait as :func:`daemon_numbers` gives its own."""
    work.mkdir(parents=True)
    env = {"CONTROLPLANE_STORE__POLL_INTERVAL_SECONDS": "1"}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    daemon = start_daemon(
        triton=triton,
        store=store,
        workdir=work,
        extra_env=env,
        python=str(python) if python else None,
    )
    try:
        time.sleep(args.settle + args.idle)
        return memory(daemon.process.pid)
    finally:
        daemon.stop()


def daemon_numbers(
    tree: Path, triton: RunningTriton, store: Path, work: Path, args: argparse.Namespace
) -> dict[str, float]:
    """One daemon of the code in ``tree`` on ``store``: idle CPU, RSS, GET /v1/models."""
    work.mkdir(parents=True)
    env = {"CONTROLPLANE_STORE__POLL_INTERVAL_SECONDS": "1", "PYTHONPATH": str(tree)}
    daemon = start_daemon(triton=triton, store=store, workdir=work, extra_env=env)
    requests = args.requests if tree == ROOT else min(args.requests, args.baseline_requests)
    try:
        time.sleep(args.settle)  # the first scans (every marker hashed once) are over
        pid = daemon.process.pid
        out = {"cpu_pct": idle_cpu(pid, args.idle), **memory(pid)}
        p50, p99, answered = latencies(daemon.get, "/v1/models", requests)
        out |= {"p50_ms": p50, "p99_ms": p99, "answered": answered}
        p50, p99, _ = latencies(daemon.get, "/healthz", requests)
        out |= {"healthz_p50_ms": p50, "healthz_p99_ms": p99}
        if tree == ROOT:
            p50, p99, answered = latencies(daemon.get, f"/v1/models?limit={args.models}", requests)
            out |= {"all_p50_ms": p50, "all_p99_ms": p99, "all_answered": answered}
        return out
    finally:
        daemon.stop()


SLOWED = {  # env that turns one background job off, or slows it to once in 300 s
    "overload": {"CONTROLPLANE_ROLLBACK__SOURCE": "none"},
    "fleet": {"CONTROLPLANE_FLEET__ENABLED": "false"},
    "reconcile": {"CONTROLPLANE_RECONCILE__INTERVAL_SECONDS": "300"},
    "poll": {"CONTROLPLANE_STORE__POLL_INTERVAL_SECONDS": "300"},
}


def floor_shares(
    triton: RunningTriton, store: Path, root: Path, args: argparse.Namespace
) -> dict[str, float]:
    """The floor (this code, a store of one model) as it runs, with each job slowed, and with
    all of them slowed: % of a core each."""
    variants: dict[str, dict[str, str]] = {"as it runs": {}, **SLOWED}
    variants["all"] = {key: value for env in SLOWED.values() for key, value in env.items()}
    out = {}
    for name, slowed in variants.items():
        work = root / f"shares-{name}"
        work.mkdir(parents=True)
        env = {"CONTROLPLANE_STORE__POLL_INTERVAL_SECONDS": "1", "PYTHONPATH": str(ROOT), **slowed}
        daemon = start_daemon(triton=triton, store=store, workdir=work, extra_env=env)
        try:
            time.sleep(args.settle)
            out[name] = idle_cpu(daemon.process.pid, args.idle)
        finally:
            daemon.stop()
        print(f"floor, {name} slowed: {out[name]:.2f} %" if slowed else f"floor: {out[name]:.2f} %")
    return out


def one_run(
    run: int,
    trees: dict[str, Path],
    triton: RunningTriton,
    stores: dict[str, Path],
    root: Path,
    args: argparse.Namespace,
    image: Path | None,
) -> dict[str, float]:
    result: dict[str, float] = {}
    codes = [*trees, "image"] if image else list(trees)
    order = codes if run % 2 else codes[::-1]
    for code in order:
        if code in ("rss", "image"):  # idle RSS only, on the big store
            work = root / f"run{run}-{code}"
            tree, python = (trees["rss"], None) if code == "rss" else (None, image)
            rss = idle_rss(tree, triton, stores["big"], work, args, python)
            result |= {f"{code}_{key}": value for key, value in rss.items()}
            print(f"run {run} {code}: RSS {result[f'{code}_rss_mib']:.0f} MiB", flush=True)
            continue
        tree = trees[code]
        scan = probe(tree, "scan", str(stores["big"]), str(args.scans))
        result |= {f"{code}_{key}": float(value) for key, value in scan.items()}
        for size, store in stores.items():
            numbers = daemon_numbers(tree, triton, store, root / f"run{run}-{code}-{size}", args)
            tag = "" if size == "big" else "floor_"
            result |= {f"{code}_{tag}{key}": value for key, value in numbers.items()}
        result["load_1min"] = os.getloadavg()[0]
        print(
            f"run {run} {code}: scan {result[f'{code}_scan_s'] * 1e3:.1f} ms, CPU "
            f"{result[f'{code}_cpu_pct']:.1f} % (floor {result[f'{code}_floor_cpu_pct']:.1f} %), "
            f"RSS {result[f'{code}_rss_mib']:.0f} MiB, GET /v1/models p99 "
            f"{result[f'{code}_p99_ms']:.0f} ms",
            flush=True,
        )
    return result


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--models", type=int, default=200, help="models in the store")
    parser.add_argument("--releases", type=int, default=20, help="releases per model")
    parser.add_argument("--runs", type=int, default=3, help="runs; medians are over runs")
    parser.add_argument("--scans", type=int, default=10, help="scans timed per run and code")
    parser.add_argument("--idle", type=float, default=30.0, help="s of idle CPU measured")
    parser.add_argument("--settle", type=float, default=5.0, help="s after ready, first")
    parser.add_argument("--requests", type=int, default=200, help="GET /v1/models per run")
    parser.add_argument(
        "--baseline-requests", type=int, default=20, help="of those, for the baseline (slow)"
    )
    parser.add_argument(
        "--no-shares", action="store_true", help="skip the floor's share per background job"
    )
    parser.add_argument("--baseline", default=BASELINE, help="the commit to compare with")
    parser.add_argument(
        "--rss-baseline", default=RSS_BASELINE, help="the commit whose idle RSS is compared too"
    )
    parser.add_argument(
        "--no-image",
        action="store_true",
        help="skip the idle RSS of a venv of the runtime dependencies only (pip installs it)",
    )
    parser.add_argument("--write-readme", action="store_true", help="update bench/README.md")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 run, 10 s idle")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs, args.idle, args.requests, args.scans = 1, 10.0, 50, 3
    counts = (args.models, args.releases, args.runs, args.scans, args.requests)
    if min(*counts, args.baseline_requests) < 1:
        parser.error("every count must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
        root = Path(tmp)
        # Not the repo root: `python -m` puts the working dir first on sys.path, before the
        # PYTHONPATH that picks the code each daemon runs.
        os.chdir(root)
        print(f"building a store of {args.models} x {args.releases} releases...", flush=True)
        stores = {
            "big": build_store(root / "store", args.models, args.releases),
            "small": build_store(root / "small-store", 1, 1),
        }
        (root / "repository").mkdir()
        triton = launch_triton(
            root / "repository", cache_dir=cache_dir(), log_path=root / "triton.log"
        )
        try:
            with (
                baseline_tree(args.baseline, root / "baseline") as old,
                baseline_tree(args.rss_baseline, root / "rss-baseline") as before,
            ):
                trees = {"new": ROOT, "old": old, "rss": before}
                summary = machine(triton)
                print(f"{summary}\n", flush=True)
                image = None if args.no_image else runtime_venv(root / "image-venv")
                imports = {"now": probe(ROOT, "imports"), "before": probe(before, "imports")}
                runs = [
                    one_run(r, trees, triton, stores, root, args, image)
                    for r in range(1, args.runs + 1)
                ]
                shares = {} if args.no_shares else floor_shares(triton, stores["small"], root, args)
        finally:
            triton.stop()
    text = section(args, summary, runs, imports, shares, datetime.now(UTC))
    print("\n" + text)
    if args.write_readme:
        write_section(text, begin=BEGIN, end=END, script="scale.py", row=INTRO_ROW)
    return 0


if __name__ == "__main__":
    run_main(main)
