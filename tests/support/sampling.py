"""A watcher that samples something in a thread while a test works, and once more at its end.

Subclasses say what one sample is (:meth:`Sampler.sample`); ``with`` starts and stops the
thread. Used for what must hold at *every* moment of an operation, not only after it (the disk
a deploy occupies, the repository Triton could read).
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Self


class Sampler:
    def __init__(self, every: float, name: str) -> None:
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()  # and once more after the work is done

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self._every)
