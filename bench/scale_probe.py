"""Run by bench/scale.py in a child process, with the code under test first on PYTHONPATH:
time the release watcher's scans of a store, as the daemon runs them, and print JSON.

Kept to what both the code before and after the scale work accept: a watcher over the local
store and the SQLite releases book, auto-deploy off (so the deploy service is never called).
The first scan records every release; the ones timed after it are the steady state of a beat
over an unchanged store. Also prints the RSS each import group adds, for the RSS table, and
what the same imports would hold with Triton's gRPC stubs built from its protos instead of
imported from tritonclient.grpc (whose package init imports numpy and ml_dtypes).
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


COMMON = [  # what the daemon imports besides Triton's client and its own code, in its order
    ("interpreter, asyncio, json (the probe itself)", []),
    ("typer, click (the CLI)", ["typer"]),
    ("ssl, uvicorn", ["ssl", "uvicorn"]),
    ("pydantic, pydantic-settings, yaml", ["pydantic", "pydantic_settings", "yaml"]),
    ("fastapi, starlette", ["fastapi"]),
    ("httpx", ["httpx"]),
]
REST = [
    (
        "prometheus_client, psutil, watchfiles, tenacity, sqlite3",
        ["prometheus_client", "psutil", "watchfiles", "tenacity", "sqlite3"],
    ),
]
PROTOS = ("model_config", "grpc_service")  # Triton's .proto files, as tritonclient compiled them


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


def imports() -> list[tuple[str, float]]:
    """RSS added by each group of imports the daemon makes, in the order it makes them."""
    return _measure(
        [
            *COMMON,
            ("numpy (tritonclient.grpc's package init imports tritonclient.utils)", ["numpy"]),
            ("ml_dtypes (the same)", ["ml_dtypes"]),
            ("grpc, protobuf", ["grpc", "grpc.aio", "google.protobuf"]),
            ("tritonclient.grpc (its stubs, client and utils)", ["tritonclient.grpc.aio"]),
            *REST,
            ("controlplane (settings, wiring, api)", ["controlplane.cli.serve"]),
        ]
    )


def descriptors(where: Path) -> None:
    """Triton's protos as tritonclient compiled them, written for :func:`stub_imports`."""
    from tritonclient.grpc import model_config_pb2, service_pb2

    for name, module in zip(PROTOS, (model_config_pb2, service_pb2), strict=True):
        (where / f"{name}.desc").write_bytes(module.DESCRIPTOR.serialized_pb)


def stub_imports(where: Path) -> list[tuple[str, float]]:
    """The same third-party imports with Triton's messages and gRPC stubs built from its
    protos (what stubs generated at build time would load), instead of tritonclient.grpc,
    whose package init imports numpy and ml_dtypes whatever submodule is asked for."""
    out = _measure([*COMMON, ("grpc, protobuf", ["grpc", "grpc.aio", "google.protobuf"]), *REST])
    import grpc
    from google.protobuf import descriptor_pool, message_factory

    before = rss_mib()
    pool = descriptor_pool.Default()
    for name in PROTOS:
        pool.AddSerializedFile((where / f"{name}.desc").read_bytes())
    service = pool.FindServiceByName("inference.GRPCInferenceService")
    channel = grpc.aio.insecure_channel("localhost:1")
    stubs = {
        method.name: channel.unary_unary(
            f"/{service.full_name}/{method.name}",
            request_serializer=message_factory.GetMessageClass(method.input_type).SerializeToString,
            response_deserializer=message_factory.GetMessageClass(method.output_type).FromString,
        )
        for method in service.methods
        if not method.client_streaming
    }
    out.append((f"Triton's messages and {len(stubs)} stubs, and a channel", rss_mib() - before))
    return out


def main() -> None:
    if sys.argv[1] == "imports":
        print(json.dumps(imports()))
        return
    if sys.argv[1] == "descriptors":
        descriptors(Path(sys.argv[2]))
        print(json.dumps(sorted(p.name for p in Path(sys.argv[2]).iterdir())))
        return
    if sys.argv[1] == "stub-imports":
        print(json.dumps(stub_imports(Path(sys.argv[2]))))
        return
    print(json.dumps(asyncio.run(scans(Path(sys.argv[2]), int(sys.argv[3])))))


if __name__ == "__main__":
    main()
