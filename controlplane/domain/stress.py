"""The stress preflight's figures and verdict: is the new slot fit to take the serving load?

Before the switch the new slot and the active one are driven with the same requests at the
same concurrency, in alternating phases of one window (new, active, new, ...), so both meet
the same machine noise. The new slot is refused when any of its requests failed, when its p99
latency is above ``max_p99_ratio`` times the active slot's (and slower by more than
``min_p99_gap_ms``: on a busy host a fast model's p99 moves by a few ms on noise alone), or
when ``/dev/shm`` or GPU memory grew by more than ``max_memory_growth_bytes`` over the window.
A figure that cannot be read (no GPU, no active slot) is reported as such and never held
against the release.

Everything here is pure: the Triton adapter measures, the stress service orders the phases.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from controlplane.domain.disk import size_text

PHASE_SECONDS = 0.5  # about how long one slot is driven before the other takes its turn
NEW = "new"
ACTIVE = "active"


@dataclass(frozen=True)
class StressPolicy:
    enabled: bool = False
    seconds: float = 10.0
    concurrency: int = 4
    max_p99_ratio: float = 2.0
    min_p99_gap_ms: float = 5.0  # a slower p99 by less than this is noise, never refused
    max_memory_growth: int = 64 * 1024**2


@dataclass(frozen=True)
class Load:
    """What one phase of driving a model gave: each answered request's latency, the failures."""

    latencies_ms: tuple[float, ...] = ()
    errors: int = 0
    first_error: str | None = None

    def __add__(self, other: Load) -> Load:
        return Load(
            self.latencies_ms + other.latencies_ms,
            self.errors + other.errors,
            self.first_error if self.first_error is not None else other.first_error,
        )


def phases(seconds: float, *, with_active: bool) -> tuple[tuple[str, float], ...]:
    """The window as (slot, seconds) phases: alternating new and active, about
    :data:`PHASE_SECONDS` each, starting with the new slot; only the new one without an active
    slot. The phases add up to ``seconds``."""
    count = max(2, round(seconds / PHASE_SECONDS))
    if with_active and count % 2:
        count += 1  # as many phases for each slot
    length = seconds / count
    order = (NEW, ACTIVE) if with_active else (NEW,)
    return tuple((order[i % len(order)], length) for i in range(count))


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q``-th percentile (0 < q <= 100); None without values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class SlotFigures:
    slot: str
    requests: int  # answered and failed
    errors: int
    p50_ms: float | None
    p99_ms: float | None
    first_error: str | None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @classmethod
    def of(cls, slot: str, load: Load) -> SlotFigures:
        return cls(
            slot=slot,
            requests=len(load.latencies_ms) + load.errors,
            errors=load.errors,
            p50_ms=_rounded(percentile(load.latencies_ms, 50)),
            p99_ms=_rounded(percentile(load.latencies_ms, 99)),
            first_error=load.first_error,
        )

    def as_detail(self) -> dict[str, object]:
        return {
            "slot": self.slot,
            "requests": self.requests,
            "errors": self.errors,
            "error_rate": round(self.error_rate, 4),
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "first_error": self.first_error,
        }


@dataclass(frozen=True)
class Growth:
    """One memory figure before and after the window; None where it could not be read."""

    key: str  # its name in the step's detail: shm, gpu_memory
    what: str  # for people: "/dev/shm", "GPU memory"
    before: int | None
    after: int | None

    @property
    def grew(self) -> int | None:
        if self.before is None or self.after is None:
            return None
        return self.after - self.before

    def as_detail(self) -> dict[str, object] | str:
        if self.grew is None:
            return "unreadable"
        return {"before_bytes": self.before, "after_bytes": self.after, "grew_bytes": self.grew}


@dataclass(frozen=True)
class Verdict:
    new: SlotFigures
    active: SlotFigures | None
    memory: tuple[Growth, ...]
    policy: StressPolicy
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def p99_ratio(self) -> float | None:
        return _ratio(self.new, self.active)

    def describe(self) -> str:
        return "; ".join(self.problems) if self.problems else "the new slot held the load"

    def as_detail(self) -> dict[str, object]:
        detail: dict[str, object] = {
            "seconds": self.policy.seconds,
            "concurrency": self.policy.concurrency,
            "new": self.new.as_detail(),
            "active": self.active.as_detail()
            if self.active is not None
            else "none: a first deploy, latency not compared",
            "p99_ratio": None if self.p99_ratio is None else round(self.p99_ratio, 2),
            "max_p99_ratio": self.policy.max_p99_ratio,
            "min_p99_gap_ms": self.policy.min_p99_gap_ms,
            "max_memory_growth_bytes": self.policy.max_memory_growth,
            "verdict": "passed" if self.ok else "refused",
        }
        for growth in self.memory:
            detail[growth.key] = growth.as_detail()
        if self.problems:
            detail["problems"] = list(self.problems)
        return detail


def judge(
    policy: StressPolicy,
    new: SlotFigures,
    active: SlotFigures | None,
    memory: Iterable[Growth],
) -> Verdict:
    memory = tuple(memory)
    problems = []
    if new.errors:
        problems.append(
            f"{new.errors} of {new.requests} requests to the new slot failed "
            f"(error rate {new.error_rate:.1%}); the first: {new.first_error}"
        )
    elif not new.requests:
        problems.append("the new slot answered no request in the stress window")
    ratio = _ratio(new, active)
    if (
        ratio is not None
        and active is not None
        and ratio > policy.max_p99_ratio
        and (new.p99_ms or 0.0) - (active.p99_ms or 0.0) > policy.min_p99_gap_ms
    ):
        problems.append(
            f"p99 {_ms(new.p99_ms)} on the new slot vs {_ms(active.p99_ms)} on the serving one "
            f"(ratio {ratio:.1f} > {policy.max_p99_ratio:.1f}, max_p99_ratio; p50 "
            f"{_ms(new.p50_ms)} vs {_ms(active.p50_ms)}, {new.requests} vs {active.requests} "
            f"requests at concurrency {policy.concurrency})"
        )
    for growth in memory:
        grew = growth.grew
        if grew is not None and grew > policy.max_memory_growth:
            problems.append(
                f"{growth.what} grew by {size_text(grew)} during the {policy.seconds:g} s "
                f"window ({size_text(growth.before or 0)} -> {size_text(growth.after or 0)} "
                f"used; max_memory_growth_bytes {size_text(policy.max_memory_growth)})"
            )
    return Verdict(new, active, memory, policy, tuple(problems))


def _ratio(new: SlotFigures, active: SlotFigures | None) -> float | None:
    if active is None or new.p99_ms is None or active.p99_ms is None:
        return None
    return new.p99_ms / max(active.p99_ms, 0.001)


def _ms(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.0f} ms" if value >= 10 else f"{value:.1f} ms"


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
