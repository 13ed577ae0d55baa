"""Steady gRPC traffic through one address (a load balancer's frontend), as an application's.

:class:`LoadClient` runs a few callers, each a thread with its own
``tritonclient.grpc`` client, calling one of the tests' scale models (``OUTPUT0 = k * INPUT0``,
tests/support/models.py) back to back with ``INPUT0 = 1``, so an answer is the serving
release's ``k``: which release, or which backend, answered. It keeps every failure (time and
error text) and, per answer, when its call was *sent*: a call sent after haproxy showed a
server DOWN is one the balancer routed with that knowledge, so
:meth:`LoadClient.answers_sent_after` is a deterministic "who served after the change".
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from types import TracebackType

import numpy as np
import tritonclient.grpc as grpcclient

__all__ = ["CallFailure", "LoadClient", "LoadSummary"]


@dataclass(frozen=True)
class CallFailure:
    caller: int
    sent_at: float  # monotonic
    seconds: float  # how long the call took to fail
    error: str

    def __str__(self) -> str:
        return f"caller {self.caller}, after {self.seconds:.3f}s: {self.error}"


@dataclass(frozen=True)
class LoadSummary:
    """What the callers saw, from start to stop."""

    successes: int
    failures: tuple[CallFailure, ...]
    answers: Counter[float]  # output value -> how many calls got it
    seconds: float

    @property
    def calls(self) -> int:
        return self.successes + len(self.failures)


class LoadClient:
    """``callers`` threads calling ``model`` at ``grpc_url`` until stopped (and at most
    ``max_seconds``), each call bounded by ``call_timeout``. ``with`` starts and stops it."""

    def __init__(
        self,
        grpc_url: str,
        model: str,
        *,
        callers: int = 3,
        call_timeout: float = 5.0,
        max_seconds: float = 120.0,
        pause: float = 0.0,
    ) -> None:
        self._url = grpc_url
        self._pause = pause  # s each caller waits between calls (0: as fast as it can)
        self._model = model
        self._call_timeout = call_timeout
        self._max_seconds = max_seconds
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._answered: list[tuple[float, float]] = []  # (sent_at, value), in answer order
        self.failures: list[CallFailure] = []
        self._started = 0.0
        self._summary: LoadSummary | None = None
        self._threads = [
            threading.Thread(target=self._call, args=(n,), name=f"grpc-load-{n}", daemon=True)
            for n in range(callers)
        ]

    def start(self) -> None:
        self._started = time.monotonic()
        for thread in self._threads:
            thread.start()

    def stop(self) -> LoadSummary:
        """Stop the callers (each ends its call in flight) and sum up. Idempotent."""
        if self._summary is None:
            self._stop.set()
            for thread in self._threads:
                thread.join(timeout=self._call_timeout + 5)
            with self._lock:
                self._summary = LoadSummary(
                    successes=len(self._answered),
                    failures=tuple(self.failures),
                    answers=Counter(value for _, value in self._answered),
                    seconds=time.monotonic() - self._started,
                )
        return self._summary

    @property
    def successes(self) -> int:
        with self._lock:
            return len(self._answered)

    def answers(self) -> Counter[float]:
        """Every answer so far: output value -> count."""
        return self.answers_sent_after(float("-inf"))

    def answers_sent_after(self, moment: float) -> Counter[float]:
        """The answers to calls sent after ``moment`` (``time.monotonic()``)."""
        with self._lock:
            return Counter(value for sent, value in self._answered if sent > moment)

    def wait_for_answers(
        self, count: int, *, sent_after: float | None = None, timeout: float = 10.0
    ) -> None:
        """Block until ``count`` answers to calls sent after ``sent_after`` (default: now)
        have come; fail with the failures so far if they do not within ``timeout``."""
        since = time.monotonic() if sent_after is None else sent_after
        deadline = time.monotonic() + timeout
        while sum(self.answers_sent_after(since).values()) < count:
            if time.monotonic() > deadline:
                with self._lock:
                    failures = "\n".join(str(f) for f in self.failures[-5:])
                raise AssertionError(
                    f"fewer than {count} answers from {self._model} within {timeout} s;"
                    f" last failures:\n{failures or '(none)'}"
                )
            time.sleep(0.01)

    def _call(self, caller: int) -> None:
        client = grpcclient.InferenceServerClient(self._url)
        tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        deadline = self._started + self._max_seconds
        try:
            while not self._stop.is_set() and time.monotonic() < deadline:
                sent = time.monotonic()
                try:
                    result = client.infer(self._model, [tensor], client_timeout=self._call_timeout)
                    output = result.as_numpy("OUTPUT0")
                    if output is None or output.shape != (1,):
                        raise ValueError(f"OUTPUT0 was {output!r}")
                    value = float(output[0])
                except Exception as exc:  # every failure is what the test counts
                    failure = CallFailure(caller, sent, time.monotonic() - sent, repr(exc)[:300])
                    with self._lock:
                        self.failures.append(failure)
                    self._stop.wait(0.01)  # a server refusing at once would fill the list
                else:
                    with self._lock:
                        self._answered.append((sent, value))
                    if self._pause:
                        self._stop.wait(self._pause)
        finally:
            client.close()

    def __enter__(self) -> LoadClient:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
