"""Clients of the served model, as an application would call it through Triton."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient


def infer_once(grpc_url: str, model: str, value: float = 1.0) -> float:
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.array([value], dtype=np.float32))
        result = client.infer(model, [tensor], client_timeout=30.0)
        output = result.as_numpy("OUTPUT0")
        assert output is not None
        return float(output[0])
    finally:
        client.close()


@dataclass
class ClientLog:
    """One client thread's answers in the order it got them, and its failures."""

    answers: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class LoadGenerator:
    """N threads calling `model` back to back until stopped (bounded by `max_seconds`)."""

    def __init__(self, grpc_url: str, model: str, clients: int = 4, max_seconds: float = 120.0):
        self._url = grpc_url
        self._model = model
        self._stop = threading.Event()
        self._deadline = time.monotonic() + max_seconds
        self.logs = [ClientLog() for _ in range(clients)]
        self._threads = [
            threading.Thread(target=self._run, args=(log,), daemon=True) for log in self.logs
        ]

    def __enter__(self) -> LoadGenerator:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def wait_for_answers(self, count: int, timeout: float = 30.0) -> None:
        """Block until every client has at least `count` more answers than now."""
        start = [len(log.answers) for log in self.logs]
        deadline = time.monotonic() + timeout
        while any(len(log.answers) - s < count for log, s in zip(self.logs, start, strict=True)):
            if time.monotonic() > deadline:
                raise AssertionError("clients made no progress")
            time.sleep(0.01)

    def _run(self, log: ClientLog) -> None:
        client = grpcclient.InferenceServerClient(self._url)
        tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        try:
            while not self._stop.is_set() and time.monotonic() < self._deadline:
                try:
                    result = client.infer(self._model, [tensor], client_timeout=30.0)
                    output = result.as_numpy("OUTPUT0")
                    assert output is not None
                    log.answers.append(float(output[0]))
                except Exception as exc:  # every failure is what the test counts
                    log.errors.append(repr(exc)[:300])
        finally:
            client.close()


def transitions(answers: list[float]) -> list[float]:
    """The distinct values in the order they first appeared, collapsing repeats."""
    seen: list[float] = []
    for value in answers:
        if not seen or seen[-1] != value:
            seen.append(value)
    return seen
