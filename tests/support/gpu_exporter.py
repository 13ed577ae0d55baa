"""A tiny HTTP exporter that serves GPU metrics text on loopback.

GPUs cannot exist on these machines, so this is the one fake the project allows: it serves the
same text format Triton's ``/metrics`` does, with values the test sets.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class GpuExporter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._utilization: dict[str, float] = {}
        self._dips: list[dict[str, float]] = []
        self._memory: dict[str, tuple[int, int]] = {}
        self.scrapes = 0
        self.failing = False
        self.extra = ""  # more of Triton's text (other families), served after the GPU's
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

    def text(self) -> str:
        with self._lock:
            self.scrapes += 1
            values = self._dips.pop(0) if self._dips else self._utilization
            memory = dict(self._memory)
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
