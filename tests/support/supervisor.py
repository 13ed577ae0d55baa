"""A Triton that is started again when its process exits, as the kubelet restarts a container.

The daemon never starts Triton: with ``memory.on_not_returned: restart-triton`` it stops
Triton's process and waits for whatever supervises it to start it again. In a pod that is the
kubelet; here, :class:`TritonSupervisor` watches a :class:`~devtools.launcher.RunningTriton`
and, when its process ends, calls ``on_exit`` (a GPU stand-in frees what the dead process
held, as the driver does) and launches Triton again on the same ports and repository, so
every URL the test and the daemon hold stays right.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from devtools.launcher import RunningTriton, launch_triton

WATCH_EVERY = 0.1  # s between looks at the process


class TritonSupervisor:
    """Keeps ``triton`` running until :meth:`stop`; ``restarts`` counts the starts after exits.
    The restarted process replaces ``triton.process``, so ``triton.stop()`` stops it."""

    def __init__(
        self, triton: RunningTriton, cache_dir: Path, on_exit: Callable[[], None] = lambda: None
    ) -> None:
        self.triton = triton
        self.restarts = 0
        self.errors: list[str] = []
        self._cache_dir = cache_dir
        self._on_exit = on_exit
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="triton-supervisor", daemon=True)

    def _watch(self) -> None:
        while not self._stopping.wait(WATCH_EVERY):
            if self.triton.process.poll() is None:
                continue
            self._on_exit()
            log = self.triton.log_path.with_name(
                f"{self.triton.log_path.stem}-restart-{self.restarts + 1}.log"
            )
            try:
                started = launch_triton(
                    self.triton.repository,
                    cache_dir=self._cache_dir,
                    ports=self.triton.ports,
                    log_path=log,
                )
            except Exception as exc:  # said by the test that reads errors, and tried again
                self.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if self._stopping.is_set():  # stopped while it started: not ours to keep
                started.stop()
                return
            self.triton.process = started.process
            self.triton.log_path = log
            self.restarts += 1

    def __enter__(self) -> TritonSupervisor:
        self._thread.start()
        return self

    def stop(self) -> None:
        """No more restarts (the test stops Triton itself)."""
        self._stopping.set()
        self._thread.join(timeout=120)

    def __exit__(self, *exc: object) -> None:
        self.stop()
