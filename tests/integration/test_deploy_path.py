"""How far one blue-green deploy travels: the modules of services and adapters whose code runs
from the route to the gRPC load.

A newcomer follows a deploy from ``POST /v1/models/{name}/deploy`` to Triton's
``RepositoryModelLoad``; each module on the way is one more file to open. The daemon is built
in-process by ``wiring.build`` on the real adapters (a directory store, staging, SQLite, the
real Triton) with no background job started, so that only the request runs; a profiler on
every thread records each ``controlplane`` module a call enters until the Triton driver's
``load``. The bound is docs/development.md's promise.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from controlplane.api.app import create_app
from controlplane.settings import Settings
from controlplane.wiring import build
from devtools.launcher import RunningTriton
from tests.support.models import write_scale_release

MOST_MODULES = 15  # of services and adapters, route to gRPC load
LOAD = ("controlplane.adapters.triton.driver", "load")


class PathTrace:
    """The ``controlplane`` modules entered, in first-entered order, until the load."""

    def __init__(self) -> None:
        self.modules: dict[str, None] = {}
        self.loaded = threading.Event()
        self._lock = threading.Lock()

    def profile(self, frame: types.FrameType, event: str, _arg: Any) -> None:
        if event != "call" or self.loaded.is_set():
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("controlplane."):
            return
        with self._lock:
            self.modules.setdefault(module, None)
        if (module, frame.f_code.co_name) == LOAD:
            self.loaded.set()

    def layer(self, *prefixes: str) -> list[str]:
        return [m for m in self.modules if m.startswith(prefixes)]


@contextmanager
def profiled(trace: PathTrace) -> Iterator[None]:
    """Profile this thread and every thread started meanwhile (the database's, the loop's
    executor, a fetch's workers)."""
    threading.setprofile(trace.profile)
    sys.setprofile(trace.profile)
    try:
        yield
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


def test_one_blue_green_deploy_crosses_at_most_15_modules_of_services_and_adapters(
    triton: RunningTriton, tmp_path: Path, model_name: str
) -> None:
    store = tmp_path / "store"
    write_scale_release(store, model_name, "r1", k=1.0)
    settings = Settings(
        triton={"grpc_url": triton.grpc_url, "metrics_url": triton.metrics_url},
        repository={"path": triton.repository},
        staging={"path": tmp_path / "staging"},
        store={"uri": store.as_uri()},
        database={"path": tmp_path / "controlplane.db"},
    )
    trace = PathTrace()

    async def deploy() -> dict[str, Any]:
        app = create_app(settings)
        with profiled(trace):
            container = build(settings)  # every thread it starts is profiled
            app.state.container = container
            container.ready.set()  # no start-up reconcile: nothing but the request runs
            trace.modules.clear()
            try:
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://cp") as http:
                    answer = await http.post(
                        f"/v1/models/{model_name}/deploy", json={"release": "r1", "wait": True}
                    )
            finally:
                await container.close()
        body: dict[str, Any] = answer.json()
        assert answer.status_code == 200, body
        return body

    body = asyncio.run(deploy())

    assert body["operation"]["status"] == "succeeded"
    assert trace.loaded.is_set(), "the trace never reached the Triton driver's load"
    print("all:", len(trace.modules), sorted(trace.modules))
    on_the_way = trace.layer("controlplane.services.", "controlplane.adapters.")
    print("\n".join(["services and adapters from the route to the load:", *on_the_way]))
    assert len(on_the_way) <= MOST_MODULES, on_the_way
