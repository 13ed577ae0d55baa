"""How far one blue-green deploy travels from the route to the gRPC load, in modules of
services and adapters, counted two ways (docs/development.md draws both):

* the call chain: the modules on the stack of the request that starts the operation (route,
  client, deploy service, runner) and on the stack of the operation's task at the moment the
  Triton driver's ``load`` is called: the files a newcomer follows from one to the other;
* everything touched: every module whose code runs on any thread between the request's arrival
  and that call (the store, staging, the database, the headroom figures, ...).

The daemon is built in-process by ``wiring.build`` on the real adapters (a directory store,
staging, SQLite, the real Triton) with no background job started, so that only the request
runs; a profiler on every thread records what each call enters.
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

MOST_ON_THE_CHAIN = 15  # of services and adapters, route to gRPC load
MOST_TOUCHED = 24  # the same deploy: every module of services and adapters whose code runs
# (23 since auto became the default: its choice, in services/rolling, comes before blue-green;
# 24 since the signature step, SHA256SUMS.sig and model.sig, left services/prepare for a
# module of its own, services/signature_step)
LOAD = ("controlplane.adapters.triton.driver", "load")
START = ("controlplane.services.runner", "start")  # where the request hands over to the task


class PathTrace:
    """The ``controlplane`` modules entered, in first-entered order, until the load."""

    def __init__(self) -> None:
        self.modules: dict[str, None] = {}
        self.chain: dict[str, None] = {}
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
            if (module, frame.f_code.co_name) in (START, LOAD):
                self._stack(frame)
        if (module, frame.f_code.co_name) == LOAD:
            self.loaded.set()

    def _stack(self, frame: types.FrameType | None) -> None:
        """The modules of the task's coroutines on the stack, innermost first (asyncio's
        frames are skipped: a task's stack starts at its coroutine)."""
        while frame is not None:
            module = frame.f_globals.get("__name__", "")
            if module.startswith("controlplane."):
                self.chain.setdefault(module, None)
            frame = frame.f_back

    @staticmethod
    def layer(found: dict[str, None]) -> list[str]:
        prefixes = ("controlplane.services.", "controlplane.adapters.")
        return [m for m in found if m.startswith(prefixes)]


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


def test_one_blue_green_deploy_reaches_the_grpc_load_through_few_modules(
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
            trace.chain.clear()
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
    chain = PathTrace.layer(trace.chain)
    touched = PathTrace.layer(trace.modules)
    print("\n".join(["on the chain from the route to the load:", *sorted(chain)]))
    print("\n".join(["touched on the way:", *touched]))
    assert len(chain) <= MOST_ON_THE_CHAIN, chain
    assert len(touched) <= MOST_TOUCHED, touched
