"""Faults of the fault campaign: planned from a seed, and what each one did.

A plan is drawn once, up front, from a seeded RNG: which operation, which step the kill is armed
on, where in that step it falls, which release a deploy goes to. Printed before the first kill,
it replays a failed campaign with the same seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from tests.support.chaos import percentile, summary_table

# (model, action, step the kill is armed on, step of the ensuing repair to kill again at)
Template = tuple[str, str, str, str | None]


@dataclass(frozen=True)
class Fault:
    number: int
    victim: str  # "daemon" or "triton"
    model: str
    action: str  # deploy, deploy-over-warm, warm-rollback, cold-rollback, retire
    step: str  # the step the kill is armed on
    again: str | None  # the step of the repair that follows where it is killed again
    fraction: float  # where in the step's measured duration the kill falls
    fraction_again: float
    pick: float  # which release a deploy goes to, among those not serving

    @property
    def kills(self) -> int:
        return 1 if self.again is None else 2

    def describe(self) -> str:
        again = f", again at repair {self.again}+{self.fraction_again:.2f}" if self.again else ""
        return (
            f"#{self.number:02d} kill {self.victim} in {self.model} {self.action} at "
            f"{self.step}+{self.fraction:.2f}{again} (pick {self.pick:.2f})"
        )


def plan(
    rng: random.Random,
    victim: str,
    templates: Sequence[Template],
    kills: int,
) -> list[Fault]:
    """Faults from the templates in a shuffled order until they make `kills` kills."""
    order = list(templates)
    rng.shuffle(order)
    faults: list[Fault] = []
    while sum(f.kills for f in faults) < kills:
        model, action, step, again = order[len(faults) % len(order)]
        draws = (rng.random(), rng.random(), rng.random())
        faults.append(Fault(len(faults) + 1, victim, model, action, step, again, *draws))
    return faults


@dataclass
class Outcome:
    fault: Fault
    change: str = ""  # from -> to
    delays: list[float] = field(default_factory=list)
    hits: list[str] = field(default_factory=list)  # where each kill fell, from the daemon's log
    statuses: list[str] = field(default_factory=list)  # each killed operation after it all
    converged_to: dict[str, str] = field(default_factory=dict)
    down: float = 0.0  # Triton kills: until Triton was live again (the last kill)
    ready: float = 0.0  # from the last kill until /readyz answered 200
    converge: float = 0.0  # from the last kill until converged
    sent: int = 0
    failed: int = 0
    failed_when: str = "-"
    notes: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)

    def line(self) -> str:
        kills = ", ".join(
            f"{hit} (+{delay * 1000:.0f} ms, op {status})"
            for hit, delay, status in zip(self.hits, self.delays, self.statuses, strict=False)
        )
        serving = ",".join(f"{m}={r}" for m, r in self.converged_to.items())
        down = f"Triton down {self.down:.2f} s, " if self.fault.victim == "triton" else ""
        return (
            f"{self.fault.describe()}: {self.change}; killed in {kills}; {down}ready in "
            f"{self.ready:.2f} s, converged in {self.converge:.2f} s to {serving}; inferences "
            f"{self.sent} sent, {self.failed} failed {self.failed_when}"
            + (f"; notes: {'; '.join(self.notes)}" if self.notes else "")
            + (f"; FINDINGS: {'; '.join(self.findings)}" if self.findings else "")
        )


def report(title: str, outcomes: list[Outcome]) -> str:
    """A summary line and one row per fault."""
    rows = [
        (
            f"#{o.fault.number:02d}",
            o.fault.model,
            o.fault.action,
            o.change,
            " / ".join(f"{h} +{d * 1000:.0f}ms" for h, d in zip(o.hits, o.delays, strict=False)),
            "/".join(o.statuses),
            f"{o.down:.2f}" if o.fault.victim == "triton" else "-",
            f"{o.ready:.2f}",
            f"{o.converge:.2f}",
            o.sent,
            o.failed,
            len(o.findings),
        )
        for o in outcomes
    ]
    header = ["fault", "model", "action", "release", "killed in", "op after", "down s"]
    header += ["ready s", "converged s", "sent", "failed", "findings"]
    converge = [o.converge for o in outcomes]
    return (
        f"{title}: {sum(o.fault.kills for o in outcomes)} kills in {len(outcomes)} faults; "
        f"converged in median {percentile(converge, 0.5):.2f} s, max "
        f"{max(converge, default=0):.2f} s; inferences {sum(o.sent for o in outcomes)} sent, "
        f"{sum(o.failed for o in outcomes)} failed\n" + summary_table(header, rows)
    )
