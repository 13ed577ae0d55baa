"""Faults on purpose, for the fault campaign: clients that stamp every call, a daemon's log
watched for the step an operation is in, and Triton killed the way a container restart kills it.

Nothing here patches the daemon: the campaign sees it only from outside, as an operator would
(its API, its log, the repository on disk, Triton's answers), and kills real processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from controlplane.adapters.triton.process import descendants, segments_mapped_by
from devtools.launcher import RunningTriton
from tests.support.tree import snapshot

SHM_ROOT = Path("/dev/shm")
ERROR_PAUSE = 0.05  # after a failed call: Triton may be down, do not spin on it


@dataclass(frozen=True)
class Call:
    """One inference: when it started and ended (time.monotonic()), its answer or its error."""

    model: str
    started: float
    ended: float
    value: float | None
    error: str | None


class TimedLoad:
    """Clients calling each model by name through Triton's gRPC API until stopped.

    Each call is stamped, so a campaign can say which failures fell inside which window (Triton
    down, a repair) and which did not. After a failure a client builds a new connection, as an
    application whose channel broke would, so its own reconnect backoff does not hide when
    Triton serves again.
    """

    def __init__(
        self,
        grpc_url: str,
        models: Sequence[str],
        *,
        clients_per_model: int = 2,
        pace: float = 0.02,
        max_seconds: float = 900.0,
    ) -> None:
        self._url = grpc_url
        self._pace = pace
        self._stop = threading.Event()
        self._deadline = time.monotonic() + max_seconds
        self._lock = threading.Lock()
        self._calls: list[Call] = []
        self._threads = [
            threading.Thread(target=self._run, args=(model,), daemon=True, name=f"load-{model}")
            for model in models
            for _ in range(clients_per_model)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def __enter__(self) -> TimedLoad:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def calls(
        self, model: str | None = None, start: float | None = None, end: float | None = None
    ) -> list[Call]:
        """Calls that started in [start, end), of ``model`` (or of all)."""
        with self._lock:
            found = list(self._calls)
        return [
            c
            for c in found
            if (model is None or c.model == model)
            and (start is None or c.started >= start)
            and (end is None or c.started < end)
        ]

    def wait_for_answers(self, model: str, count: int, timeout: float = 30.0) -> None:
        """Block until ``model`` has ``count`` more answers than now."""
        start = time.monotonic()
        deadline = start + timeout
        while len([c for c in self.calls(model, start) if c.error is None]) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"clients of {model} got no {count} answers in {timeout} s")
            time.sleep(0.02)

    def _run(self, model: str) -> None:
        tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        client = grpcclient.InferenceServerClient(self._url)
        try:
            while not self._stop.is_set() and time.monotonic() < self._deadline:
                started = time.monotonic()
                try:
                    result = client.infer(model, [tensor], client_timeout=30.0)
                    output = result.as_numpy("OUTPUT0")
                    assert output is not None
                    self._record(Call(model, started, time.monotonic(), float(output[0]), None))
                except Exception as exc:  # every failure is what the campaign counts
                    self._record(Call(model, started, time.monotonic(), None, repr(exc)[:300]))
                    client.close()
                    self._stop.wait(ERROR_PAUSE)
                    client = grpcclient.InferenceServerClient(self._url)
                    continue
                self._stop.wait(self._pace)
        finally:
            client.close()

    def _record(self, call: Call) -> None:
        with self._lock:
            self._calls.append(call)


class LogWatch:
    """The JSON lines a daemon writes to its log from now on."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = path.stat().st_size if path.exists() else 0
        self._partial = b""
        self.seen: list[dict[str, Any]] = []

    def read(self) -> list[dict[str, Any]]:
        """Lines written since the last read (lines that are not JSON are skipped)."""
        try:
            with self._path.open("rb") as log:
                log.seek(self._offset)
                data = log.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        new: list[dict[str, Any]] = []
        for line in lines:
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict):
                    new.append(entry)
        self.seen.extend(new)
        return new

    def wait_for(
        self, match: Callable[[dict[str, Any]], bool], timeout: float, every: float = 0.002
    ) -> dict[str, Any] | None:
        """The first line (since this watch began) that ``match`` accepts; None after
        ``timeout``. Polls often: some steps last a millisecond."""
        for entry in self.seen:
            if match(entry):
                return entry
        deadline = time.monotonic() + timeout
        while True:
            for entry in self.read():
                if match(entry):
                    return entry
            if time.monotonic() > deadline:
                return None
            time.sleep(every)


def step_reached(entry: dict[str, Any]) -> bool:
    """The line an operation writes when one of its steps starts."""
    return entry.get("message") == f"step {entry.get('step')} started"


def step_started(operation_id: str, step: str) -> Callable[[dict[str, Any]], bool]:
    def match(entry: dict[str, Any]) -> bool:
        return (
            entry.get("operation_id") == operation_id
            and entry.get("step") == step
            and step_reached(entry)
        )

    return match


def operation_ended(operation_id: str) -> Callable[[dict[str, Any]], bool]:
    def match(entry: dict[str, Any]) -> bool:
        message = str(entry.get("message", ""))
        return entry.get("operation_id") == operation_id and (
            message == "operation succeeded"
            or message.startswith(("operation failed", "operation interrupted"))
        )

    return match


def hit_in_log(entries: list[dict[str, Any]], operation_id: str, before: float) -> str:
    """Where an operation was at wall time `before`, from the daemon's own log lines (its
    journal lags them: records are queued to the database's thread)."""
    where = "before its first step"
    ended = operation_ended(operation_id)
    for entry in entries:
        at = wall(entry.get("time"))
        if entry.get("operation_id") != operation_id or at is None or at > before:
            continue
        message = str(entry.get("message", ""))
        if step_reached(entry):
            where = str(entry.get("step"))
        elif message.startswith("step ") and " done in " in message:
            where = f"after {entry.get('step')}"
        elif ended(entry):
            where = "after its end"
    return where


def wall(iso: object) -> float | None:
    """An ISO time from the daemon (its log, its API) as seconds since the epoch."""
    if not isinstance(iso, str):
        return None
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


def kill_triton(triton: RunningTriton) -> list[str]:
    """SIGKILL Triton and its Python-backend stubs at once, as a container restart does.

    The group is frozen first (SIGSTOP), so the shared-memory segments it maps can be read
    exactly; no process runs a line of clean-up before the SIGKILL. A killed stub leaves its
    ``/dev/shm`` segments behind: they are removed here (only those this Triton mapped), so a
    campaign leaves nothing on the machine. Returns their names.
    """
    group = os.getpgid(triton.pid)
    os.killpg(group, signal.SIGSTOP)
    pids = [triton.pid, *descendants(triton.pid)]
    segments = segments_mapped_by(pids)
    os.killpg(group, signal.SIGKILL)
    for pid in pids:  # a stub that left the group would otherwise stay frozen
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    triton.process.wait()
    triton.stop()  # reaps, and kills whatever is left of the group
    for name in segments:
        (SHM_ROOT / name).unlink(missing_ok=True)
    return sorted(segments)


def release_of(placed: Path, store: Path, model: str) -> str | None:
    """The store release ``placed`` is a complete copy of (every file of it there, byte for
    byte; ``config.pbtxt`` is rewritten with the slot's name, so only its presence counts);
    None when it is a copy of none."""
    held = snapshot(placed)
    if "config.pbtxt" not in held:
        return None
    for release_dir in sorted((store / model).iterdir()):
        original = snapshot(release_dir)
        if all(
            held.get(path) == digest for path, digest in original.items() if path != "config.pbtxt"
        ):
            return release_dir.name
    return None


def half_placed(
    repository: Path, store: Path, models: Iterable[str], alias_dirs: Iterable[str]
) -> dict[str, list[str]]:
    """Dirs in the repository that hold no complete release (alias dirs excepted): name ->
    the files it holds. Empty whatever the moment a daemon died at."""
    aliases = set(alias_dirs)
    owners = list(models)
    found: dict[str, list[str]] = {}
    for entry in sorted(repository.iterdir()):
        if entry.name in aliases or not entry.is_dir():  # a file there: the daemon's lock
            continue
        owner = next(
            (m for m in owners if entry.name == m or entry.name.startswith(m + "__")), None
        )
        if owner is None or release_of(entry, store, owner) is None:
            found[entry.name] = sorted(snapshot(entry))
    return found


def summary_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A plain text table with aligned columns."""
    text = [[str(h) for h in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in text) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in text
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; 0.0 when there are none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]
