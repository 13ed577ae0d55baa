"""Run by bench/scale.py in a child process, with the code under test first on PYTHONPATH:
time the release watcher's scans of a store, as the daemon runs them, and print JSON.

Kept to what both the code before and after the scale work accept: a watcher over the local
store and the SQLite releases book, auto-deploy off (so the deploy service is never called).
The first scan records every release; the ones timed after it are the steady state of a beat
over an unchanged store. Also prints the RSS each import group adds, for the RSS table.
"""

from __future__ import annotations

import asyncio
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def scans(store_path: Path, count: int) -> dict[str, Any]:
    from controlplane.adapters.clock import SystemClock
    from controlplane.adapters.persistence import SqliteRepos
    from controlplane.adapters.stores.local import LocalStore
    from controlplane.services.coordination import TaskOwner
    from controlplane.services.watcher import ReleaseWatcher

    with tempfile.TemporaryDirectory(prefix="scale-probe-") as tmp:
        repos = SqliteRepos.open(Path(tmp) / "controlplane.db")
        watcher = ReleaseWatcher(
            store=LocalStore(store_path),
            deploy=None,  # type: ignore[arg-type]  # auto-deploy is off: never called
            releases=repos.releases,
            serving=repos.serving,
            rollbacks=repos.rollbacks,
            clock=SystemClock(),
            tasks=TaskOwner(),
            auto_deploy=lambda _model: False,
            interval=1.0,
        )
        started = time.perf_counter()
        first = await watcher.scan()
        first_s = time.perf_counter() - started
        walls, cpus = [], []
        for _ in range(count):
            wall, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            result = await watcher.scan()
            after = resource.getrusage(resource.RUSAGE_SELF)
            walls.append(time.perf_counter() - wall)
            cpus.append(after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime)
            assert not result.new, "the store changed during the bench"
        repos.close()
    return {
        "first_scan_s": first_s,
        "first_new": len(first.new),
        "scan_s": statistics.median(walls),
        "scan_cpu_s": statistics.median(cpus),
    }


def imports() -> list[tuple[str, float]]:
    """RSS added by each group of imports the daemon makes, in the order it makes them."""
    groups = [
        ("interpreter, asyncio, json (the probe itself)", []),
        ("typer, click (the CLI)", ["typer"]),
        ("ssl, uvicorn", ["ssl", "uvicorn"]),
        ("pydantic, pydantic-settings, yaml", ["pydantic", "pydantic_settings", "yaml"]),
        ("fastapi, starlette", ["fastapi"]),
        ("httpx", ["httpx"]),
        ("numpy (imported by tritonclient.grpc)", ["numpy"]),
        ("grpc, protobuf", ["grpc", "google.protobuf"]),
        ("tritonclient.grpc", ["tritonclient.grpc.aio"]),
        ("prometheus_client, psutil, watchfiles, tenacity", ["prometheus_client", "psutil"]),
        ("controlplane (settings, wiring, api)", ["controlplane.cli.serve"]),
    ]
    import importlib

    out = []
    before = rss_mib()
    for label, modules in groups:
        for module in modules:
            importlib.import_module(module)
        now = rss_mib()
        out.append((label, now if not modules else now - before))
        before = now
    return out


def main() -> None:
    if sys.argv[1] == "imports":
        print(json.dumps(imports()))
        return
    print(json.dumps(asyncio.run(scans(Path(sys.argv[2]), int(sys.argv[3])))))


if __name__ == "__main__":
    main()
