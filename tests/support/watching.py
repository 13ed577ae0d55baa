"""A long-running CLI command as a script meets it: stdout a pipe, read as it comes.

``status --watch`` never ends by itself; a test reads its lines in a thread and waits for the
one it expects with a deadline, then stops it with a signal, as Ctrl-C would.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import IO

from tests.support.polling import eventually


class Lines:
    """A process's stdout read by a thread, so that a test waits for a line with a deadline."""

    def __init__(self, stream: IO[str]) -> None:
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._lock:
                self._lines.append(line.rstrip("\n"))

    def now(self) -> list[str]:
        with self._lock:
            return list(self._lines)

    def wait_for(self, check: Callable[[list[str]], bool], what: str) -> list[str]:
        eventually(lambda: check(self.now()), 60, what)
        return self.now()

    def join(self) -> None:
        self._thread.join(timeout=10)


@contextlib.contextmanager
def watching(env: Mapping[str, str], *args: str) -> Iterator[tuple[subprocess.Popen[str], Lines]]:
    """`controlplane status --watch ...` with stdout a pipe, as a script or a test sees it;
    killed at the end if it still runs."""
    command = [sys.executable, "-m", "controlplane", "status", "--watch", *args]
    with subprocess.Popen(
        command, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        assert process.stdout is not None
        lines = Lines(process.stdout)
        try:
            yield process, lines
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()
            lines.join()


def blocks(lines: list[str]) -> list[list[str]]:
    """The views `status --watch` printed into a pipe: each one under its `--- <time>` line."""
    found: list[list[str]] = []
    for line in lines:
        if line.startswith("--- "):
            found.append([])
        elif found:
            found[-1].append(line)
    return found
