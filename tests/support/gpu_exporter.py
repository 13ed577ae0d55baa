"""A tiny HTTP exporter that serves GPU metrics text on loopback.

GPUs cannot exist on these machines, so this is the one fake the project allows: it serves the
same text format Triton's ``/metrics`` does (one series per ``gpu_uuid``, the only label the
daemon reads), with values the test sets, or, for one GPU, memory that follows what a real
Triton has loaded (:meth:`GpuExporter.follow`): each scrape asks that Triton which models are
READY, so a load or an unload shows in the next scrape, as on a GPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

GIB = 1024**3


@dataclass
class _Following:
    """The followed Triton and what the last answer from it counted."""

    client: httpx.Client
    gpu: str
    total_bytes: int
    per_model_bytes: int
    base_bytes: int
    counts: Callable[[str], bool] | None
    ready: frozenset[str] = frozenset()  # counted models READY at the last answer
    kept: set[str] = field(default_factory=set)  # seen READY while keep_unloaded was on


class GpuExporter:
    """Serves ``url`` while in ``with``: utilisation per GPU (:meth:`set`, :meth:`dip`),
    memory per GPU (:meth:`set_memory`, or :meth:`follow` a Triton), 500s while
    ``failing``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._utilization: dict[str, float] = {}
        self._dips: list[dict[str, float]] = []
        self._memory: dict[str, tuple[int, int]] = {}
        self.scrapes = 0
        self.failing = False
        self.extra = ""  # more of Triton's text (other families), served after the GPU's
        self._keep_unloaded = False
        self._following: _Following | None = None
        self._follow_lock = threading.Lock()  # one question to Triton at a time
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if exporter.failing:
                    self.send_response(500)
                    self.end_headers()
                    return
                body = exporter.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/metrics"

    def set(self, **per_gpu: float) -> None:
        with self._lock:
            self._utilization = dict(per_gpu)

    def set_memory(self, **per_gpu: tuple[int, int]) -> None:
        """``nv_gpu_memory_total_bytes`` and ``nv_gpu_memory_used_bytes``: (total, used)."""
        with self._lock:
            self._memory = dict(per_gpu)

    def dip(self, scrapes: int = 1, **per_gpu: float) -> None:
        """Serve ``per_gpu`` to the next ``scrapes`` scrapes only, then the set values again."""
        with self._lock:
            self._dips.extend(dict(per_gpu) for _ in range(scrapes))

    def follow(
        self,
        triton_http_url: str,
        *,
        total_bytes: int = 16 * GIB,
        per_model_bytes: int = 9 * GIB,
        base_bytes: int = 0,
        gpu: str = "GPU-0",
        counts: Callable[[str], bool] | None = None,
        keep_unloaded: bool = False,
    ) -> None:
        """Serve ``gpu``'s memory as what the Triton at ``triton_http_url`` has loaded: used =
        ``base_bytes`` + ``per_model_bytes`` x the READY models counted, at most
        ``total_bytes``. Asked on every scrape; when Triton does not answer, the last figures.

        Counted by default: every READY model whose config is not an ensemble (the
        blue-green alias ``<model>`` is one, and uses no memory; its slots ``<model>__blue``
        and ``<model>__green`` are not), asked per model from Triton. ``counts(name)`` instead
        decides by name alone (``lambda name: "__" in name``: the slots only). Other GPUs
        set by :meth:`set_memory` are served beside it.
        """
        # No kept-alive connection: Triton's shutdown waits up to its exit timeout (10 s) for
        # every open HTTP connection to close, so a test stopping the followed Triton would.
        client = httpx.Client(
            base_url=triton_http_url,
            timeout=1.0,
            trust_env=False,
            limits=httpx.Limits(max_keepalive_connections=0),
        )
        following = _Following(client, gpu, total_bytes, per_model_bytes, base_bytes, counts)
        with self._follow_lock:
            old, self._following = self._following, following
            self._keep_unloaded = keep_unloaded
        if old is not None:
            old.client.close()

    @property
    def keep_unloaded(self) -> bool:
        """Under :meth:`follow`: a model seen READY keeps its memory after it unloads (a GPU
        that leaks), from the moment this is set (the models READY at the last scrape
        included) until :meth:`release_kept`. Turned off, it keeps no more models, but what
        it kept stays counted until then."""
        return self._keep_unloaded

    @keep_unloaded.setter
    def keep_unloaded(self, keep: bool) -> None:
        with self._follow_lock:
            self._keep_unloaded = keep
            if keep and self._following is not None:
                self._following.kept |= self._following.ready

    def release_kept(self) -> None:
        """Give back the memory of unloaded models kept by ``keep_unloaded`` (the leak
        repaired, as a GPU reset would); models still READY stay counted."""
        with self._follow_lock:
            if self._following is not None:
                self._following.kept.clear()

    @property
    def counted_models(self) -> frozenset[str]:
        """The models whose memory the last scrape served (READY ones and kept ones)."""
        with self._follow_lock:
            following = self._following
            return frozenset() if following is None else following.ready | following.kept

    def _followed_memory(self) -> tuple[str, tuple[int, int]] | None:
        """(gpu, (total, used)) under follow(), after asking Triton; None when not following."""
        with self._follow_lock:
            following = self._following
            if following is None:
                return None
            ready = _ready_models(following.client, following.counts)
            if ready is not None:
                following.ready = ready
            if self._keep_unloaded:
                following.kept |= following.ready
            models = len(following.ready | following.kept)
            used = following.base_bytes + following.per_model_bytes * models
            return following.gpu, (following.total_bytes, min(used, following.total_bytes))

    def text(self) -> str:
        followed = self._followed_memory()
        with self._lock:
            self.scrapes += 1
            values = self._dips.pop(0) if self._dips else self._utilization
            memory = dict(self._memory)
        if followed is not None:
            memory[followed[0]] = followed[1]
        lines = [
            "# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)",
            "# TYPE nv_gpu_utilization gauge",
            *(f'nv_gpu_utilization{{gpu_uuid="{uuid}"}} {v}' for uuid, v in values.items()),
        ]
        for name, index in (("total", 0), ("used", 1)):
            lines += [
                f"# HELP nv_gpu_memory_{name}_bytes GPU {name} memory, in bytes",
                f"# TYPE nv_gpu_memory_{name}_bytes gauge",
                *(
                    f'nv_gpu_memory_{name}_bytes{{gpu_uuid="{uuid}"}} {figures[index]}'
                    for uuid, figures in memory.items()
                ),
            ]
        return "\n".join(lines) + "\n" + self.extra

    def __enter__(self) -> GpuExporter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        with self._follow_lock:
            if self._following is not None:
                self._following.client.close()


def _ready_models(
    client: httpx.Client, counts: Callable[[str], bool] | None
) -> frozenset[str] | None:
    """The READY models Triton has that ``counts`` selects (None: those that are not
    ensembles); None when Triton did not answer."""
    try:
        index = client.post("/v2/repository/index", json={"ready": True})
        index.raise_for_status()
        names = {entry["name"] for entry in index.json() if entry.get("state") == "READY"}
        if counts is not None:
            return frozenset(name for name in names if counts(name))
        counted = set()
        for name in names:
            config = client.get(f"/v2/models/{name}/config")
            # Not 200: unloaded since the index was read, so it holds no memory now.
            if config.status_code == 200 and config.json().get("platform") != "ensemble":
                counted.add(name)
        return frozenset(counted)
    except (httpx.HTTPError, ValueError):
        return None
