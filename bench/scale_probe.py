"""Run by bench/scale.py in a child process, with the code under test first on PYTHONPATH:
time the release watcher's scans of a store, as the daemon runs them, and print JSON.

Kept to what both the code before and after the scale work accept: a watcher over the local
store and the SQLite releases book, auto-deploy off (so the deploy service is never called).
The first scan records every release; the ones timed after it are the steady state of a beat
over an unchanged store. Also prints the RSS each import group adds, for the RSS table: run
with the code before the RSS work too, the same groups say what that work took out.
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
    from controlplane.adapters.persistence import SqliteRepos
    from controlplane.adapters.stores.local import LocalStore
    from controlplane.services.tasks import TaskOwner
    from controlplane.services.watcher import ReleaseWatcher
    from controlplane.timing import SystemClock

    with tempfile.TemporaryDirectory(prefix="scale-probe-") as tmp:
        repos = SqliteRepos.open(Path(tmp) / "controlplane.db")
        watcher = ReleaseWatcher(
            store=LocalStore(store_path),
            deploy=None,  # type: ignore[arg-type]  # auto-deploy is off: never called
            client=None,  # type: ignore[arg-type]
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


GROUPS = [  # what the daemon imports before its own code, in its order
    ("interpreter, asyncio, json (the probe itself)", []),
    ("typer, click (the CLI)", ["typer"]),
    ("ssl, uvicorn", ["ssl", "uvicorn"]),
    ("pydantic, pydantic-settings, yaml", ["pydantic", "pydantic_settings", "yaml"]),
    ("fastapi, starlette (and opentelemetry, which fastapi imports)", ["fastapi"]),
    (
        "rich, pygments (httpx's package init imports its command-line client, which needs them)",
        [*(f"pygments.{name}" for name in ("lexers", "util"))]
        + [f"rich.{name}" for name in ("console", "markup", "progress", "syntax", "table")],
    ),
    ("httpx", ["httpx"]),
    (
        "prometheus_client, psutil, watchfiles, tenacity, sqlite3",
        ["prometheus_client", "psutil", "watchfiles", "tenacity", "sqlite3"],
    ),
]
SERVE = ("controlplane.cli.main", "controlplane.cli.serve")  # what `controlplane serve` imports
SHOWN = 0.3  # MiB: a package adding less is counted under "other packages"
LABELS = {"google": "protobuf", "standard library": "standard library modules"}
RUN_TIME = "httpcore, h11 (httpx's first client; with trio and attrs where installed)"


def _measure(groups: list[tuple[str, list[str]]]) -> list[tuple[str, float]]:
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


def _by_package(modules: tuple[str, ...]) -> dict[str, float]:
    """Import ``modules``; the RSS each top-level package adds, its own imports of other
    packages left out (an import hook reads VmRSS around every first import)."""
    import builtins

    own: dict[str, float] = {}
    nested: list[float] = []
    original = builtins.__import__

    def hooked(
        name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        if level or name in sys.modules:
            return original(name, globals, locals, fromlist, level)
        start = rss_mib()
        nested.append(0.0)
        try:
            return original(name, globals, locals, fromlist, level)
        finally:
            total, inner = rss_mib() - start, nested.pop()
            top = name.split(".")[0]
            key = "standard library" if top in sys.stdlib_module_names else top
            own[key] = own.get(key, 0.0) + total - inner
            if nested:
                nested[-1] += total

    builtins.__import__ = hooked
    try:
        for module in modules:
            __import__(module)
    finally:
        builtins.__import__ = original
    return own


def imports() -> list[tuple[str, float]]:
    """RSS added by each group of imports the daemon makes, in the order it makes them: the
    libraries both versions share, then what its own modules bring (per package), then what
    its first HTTP client loads at run time."""
    out = _measure(GROUPS)
    packages = _by_package(SERVE)
    shown = sorted(
        ((name, mib) for name, mib in packages.items() if mib >= SHOWN and name != "controlplane"),
        key=lambda item: -item[1],
    )
    others = [mib for name, mib in packages.items() if mib < SHOWN and name != "controlplane"]
    out += [(LABELS.get(name, name), mib) for name, mib in shown]
    out.append((f"other packages, each < {SHOWN} MiB", sum(others)))
    out.append(("controlplane's own modules", packages.get("controlplane", 0.0)))
    import httpx

    before = rss_mib()
    client = httpx.AsyncClient(verify=False)  # noqa: S501  (a plain-HTTP client, as the daemon's)
    out.append((RUN_TIME, rss_mib() - before))
    del client
    return out


def main() -> None:
    if sys.argv[1] == "imports":
        print(json.dumps(imports()))
        return
    print(json.dumps(asyncio.run(scans(Path(sys.argv[2]), int(sys.argv[3])))))


if __name__ == "__main__":
    main()
