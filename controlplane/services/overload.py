"""The overload watcher: samples GPU utilisation, asks the evaluator, rolls back on breach.

Every ``interval`` it reads the source (Triton's /metrics or a Prometheus query), combines the
GPUs into one value and keeps the samples of the last window. A breach hands every model that
has a fallback to :class:`AutoRollback` (the cooldown there stops repeats); ``unknown`` holds
and is reported, never acted on. The latest evaluation is what ``GET /v1/models/{name}``
shows.

Besides the window it decides on, it keeps a longer history for people (the status page's
plot): the combined value of every sample of the last :data:`HISTORY_SECONDS`, stamped with
the wall clock (rollback records are), in memory only and never more than
:data:`HISTORY_POINTS` of them whatever the interval.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta

from controlplane.domain.evaluator import (
    Aggregate,
    Evaluation,
    EvaluatorConfig,
    Sample,
    Verdict,
    combine,
    evaluate,
)
from controlplane.domain.operations import Trigger
from controlplane.ports import Clock, Telemetry, UtilizationSource
from controlplane.services.rollback import AutoRollback
from controlplane.services.tasks import TaskOwner
from controlplane.services.telemetry import NO_TELEMETRY

log = logging.getLogger(__name__)
HISTORY_SECONDS = 300.0
HISTORY_POINTS = 1200  # 4 a second over the history: a short interval cannot grow it further


@dataclass(frozen=True)
class GpuPoint:
    """One sample as a person sees it: when (wall clock) and the combined utilisation, None
    when the source could not be read or reports no GPU."""

    at: datetime
    value: float | None


@dataclass(frozen=True)
class OverloadView:
    """What the watcher thinks now, for status."""

    source: str
    evaluation: Evaluation
    at: datetime
    last_value: float | None
    note: str  # why the last sample is missing, if it is
    no_gpu: bool = False  # the source answered, and reports no GPU: nothing can overload

    @property
    def heartbeat(self) -> str:
        """The verdict a member's heartbeat carries: ``no_gpu`` when there is no GPU to
        watch, else the evaluator's."""
        if self.last_value is None and self.no_gpu:
            return "no_gpu"
        return self.evaluation.verdict.value


class OverloadWatcher:
    def __init__(
        self,
        *,
        source: UtilizationSource,
        source_name: str,
        rollback: AutoRollback,
        clock: Clock,
        tasks: TaskOwner,
        config: EvaluatorConfig,
        aggregate: Aggregate,
        scale: float = 1.0,
        telemetry: Telemetry = NO_TELEMETRY,
    ) -> None:
        self._telemetry = telemetry
        self._source = source
        self._source_name = source_name
        self._rollback = rollback
        self._clock = clock
        self._tasks = tasks
        self._config = config
        self._aggregate = aggregate
        self._scale = scale
        self._samples: deque[Sample] = deque()
        self._history: deque[GpuPoint] = deque(maxlen=HISTORY_POINTS)
        self._view: OverloadView | None = None

    @property
    def view(self) -> OverloadView | None:
        return self._view

    def latest(self) -> OverloadView | None:
        """:attr:`view`, as a call (for status)."""
        return self._view

    def verdict(self) -> str:
        """What a heartbeat says of this member's GPU (``unknown`` before the first sample)."""
        return self._view.heartbeat if self._view is not None else "unknown"

    @property
    def threshold(self) -> float:
        """The threshold samples are compared with, in the unit of :meth:`history` (a ratio)."""
        return self._config.threshold

    def history(self) -> tuple[GpuPoint, ...]:
        """The samples of the last :data:`HISTORY_SECONDS`, oldest first."""
        self._forget_old(self._clock.now())
        return tuple(self._history)

    def _forget_old(self, now: datetime) -> None:
        horizon = now - timedelta(seconds=HISTORY_SECONDS)
        while self._history and self._history[0].at < horizon:
            self._history.popleft()

    async def run(self) -> None:
        """Sample on a fixed beat until cancelled (shutdown)."""
        beat = self._clock.monotonic()
        while True:
            await self.tick(at=beat)
            beat += self._config.interval
            now = self._clock.monotonic()
            beat = max(beat, now)  # after a stall, resume the beat rather than rush
            await self._clock.sleep(beat - now)

    async def tick(self, at: float | None = None) -> Evaluation:
        """One sample, stamped ``at`` (the beat it belongs to): how late the loop woke up or
        the scrape answered must not decide whether the first high sample opens a window."""
        now = self._clock.monotonic() if at is None else at
        per_gpu = await self._source.gpu_utilization()
        value = combine(per_gpu, self._aggregate) if per_gpu else None
        if value is not None:
            value *= self._scale
        note = "" if value is not None else _missing(per_gpu)
        self._samples.append(Sample(now, value))
        horizon = now - self._config.window - 2 * self._config.max_gap
        while self._samples and self._samples[0].at < horizon:
            self._samples.popleft()
        evaluation = evaluate(self._samples, now, self._config)
        previous = self._view.evaluation.verdict if self._view else None
        stamp = self._clock.now()
        self._history.append(GpuPoint(stamp, value))
        self._forget_old(stamp)
        self._view = OverloadView(
            self._source_name, evaluation, stamp, value, note, no_gpu=per_gpu == {}
        )
        self._telemetry.overload_evaluated(evaluation.verdict.value, value)
        if evaluation.verdict is not previous:
            level = logging.WARNING if evaluation.verdict is Verdict.BREACH else logging.INFO
            log.log(level, "GPU overload verdict: %s (%s)", evaluation.verdict, evaluation.reason)
        if evaluation.verdict is Verdict.BREACH and self._tasks.get("overload-action") is None:
            reason = (
                f"GPU utilisation above {self._config.threshold:g} for "
                f"{self._config.window:g} s ({self._source_name})"
            )
            self._tasks.spawn(
                "overload-action",
                self._rollback.on_overload(None, trigger=Trigger.WATCHER, reason=reason),
            )
        return evaluation


def _missing(per_gpu: dict[str, float] | None) -> str:
    if per_gpu is None:
        return "the source could not be read"
    return "the source reports no GPU (no nv_gpu_utilization series)"
