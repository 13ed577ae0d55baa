"""The fault campaign: the daemon and Triton SIGKILLed at random points of deploys, rollbacks,
retires and repairs, under client load, and what must hold after every restart.

The README promises crash-safety (a daemon killed at any moment comes back serving the last
release that succeeded, complete, with staging clean and the interrupted operation marked) and
that the reconcile loop repairs a Triton restart by itself. test_crash.py pins single moments;
this campaign spreads many kills over every step, with the real daemon process, a Triton of
its own (restarted on the same ports, as a container restart would), a blue-green and an
inplace model side by side, and clients calling both by name throughout. Some faults kill
twice: again while the daemon repairs the first kill (a crash loop), or while it reloads what
a Triton restart lost.

Each kill is armed on a step: the daemon's log says the step started, then a delay drawn from
a seeded RNG (a fraction of that step's duration, measured on this machine at set-up) passes,
then SIGKILL. Where the kill really fell is read back from the log. The plan is printed first,
one line per fault after it; a failure replays with ``CHAOS_SEED=<seed>``. After each fault the
campaign polls, with a deadline, until the daemon is ready, nothing runs, and every model
answers what its complete, recorded release computes (tests/support/campaign.py); then it
checks what must have held all along.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TritonFactory
from tests.support.campaign import Campaign, Cast
from tests.support.chaos import (
    LogWatch,
    TimedLoad,
    hit_in_log,
    operation_ended,
    step_started,
)
from tests.support.faults import Fault, Outcome, Template, plan, report
from tests.support.models import write_scale_release

pytestmark = pytest.mark.triton

# The campaign's size: SIGKILLs per phase (a crash-loop fault kills twice).
DAEMON_KILLS = 20
TRITON_KILLS = 5
SEED = int(os.environ.get("CHAOS_SEED", "20260"))

BG, IP = "chaos-bg", "chaos-ip"  # a Triton of the campaign's own: no other test shares names
INIT_SLEEP = 0.2  # every load is this much longer: a wider window for kills inside "load"
ARM_TIMEOUT = 30.0
REPAIR_TIMEOUT = 20.0  # a daemon starts (about 3 s here) and reconciles within this


def answer(model: str, release: str) -> float:
    """What `release` of `model` answers for input 1.0 (values differ per model)."""
    return float(release.lstrip("r")) * (1.0 if model == BG else 10.0)


CAST = Cast(BG, IP, ("r1", "r2", "r3", "r4"), answer, retire_after=1.5)

# Rollbacks of the blue-green model are warm (a re-point) right after a deploy, cold (a load)
# once the old slot retired; a deploy over a warm slot frees that slot first.
DAEMON_FAULTS: list[Template] = [
    (BG, "deploy", "fetch", None),
    (BG, "deploy", "place", None),
    (BG, "deploy", "load", None),
    (BG, "deploy", "preflight", None),
    (BG, "deploy", "switch", "switch"),  # killed again while reconcile re-points the alias
    (BG, "deploy", "record", None),
    (BG, "deploy-over-warm", "free", None),
    (BG, "warm-rollback", "switch", None),
    (BG, "warm-rollback", "record", None),
    (BG, "cold-rollback", "load", None),
    (BG, "retire", "unload", None),
    (BG, "deploy", "load", "unload"),  # killed again while reconcile takes the new slot down
    (IP, "deploy", "fetch", None),
    (IP, "deploy", "place", None),
    (IP, "deploy", "load", None),
    (IP, "deploy", "record", None),
    (IP, "cold-rollback", "load", None),
    (IP, "deploy", "load", "load"),  # killed again while reconcile reloads the good release
]
TRITON_FAULTS: list[Template] = [
    (BG, "deploy", "load", None),
    (BG, "deploy", "preflight", None),
    (BG, "warm-rollback", "switch", None),
    (BG, "retire", "unload", None),
    (IP, "deploy", "load", None),
    (IP, "cold-rollback", "place", None),
    (IP, "deploy", "record", "load"),  # killed again while the daemon reloads what it lost
]


def arm_and_kill(
    c: Campaign,
    fault: Fault,
    watch: LogWatch,
    operation: dict[str, Any] | None,
    again: bool,
    out: Outcome,
) -> float:
    """Wait for the operation's armed step, let the drawn delay pass, kill; when that was.
    Without an operation (no repair came to kill again), kill at once."""
    step = fault.again if again else fault.step
    assert step is not None
    delay = 0.0
    if operation is not None:
        reached, ended = step_started(operation["id"], step), operation_ended(operation["id"])
        seen = watch.wait_for(lambda e: reached(e) or ended(e), ARM_TIMEOUT)
        if seen is None or not reached(seen):
            out.notes.append(f"{operation['kind']} {operation['id']} ended before {step}")
        fraction = fault.fraction_again if again else fault.fraction
        if fault.again is not None and not again:
            fraction /= 2  # a crash loop's first kill: early enough that a repair follows
        delay = fraction * c.window(fault.model, step)
        time.sleep(delay)  # chaos: where in the step the kill falls
    killed_wall = time.time()
    killed_at = c.kill(fault.victim, out, last=again or fault.again is None)
    watch.read()
    out.delays.append(delay)
    if operation is None:
        out.hits.append("no repair came")
    else:
        out.hits.append(
            f"{operation['kind']} {hit_in_log(watch.seen, operation['id'], killed_wall)}"
        )
    return killed_at


def strike(c: Campaign, fault: Fault) -> Outcome:
    """One fault: start the operation, kill on its step (and again in the repair that
    follows), wait for convergence, then check what must have held."""
    out = Outcome(fault)
    model = fault.model
    if fault.action in ("warm-rollback", "retire", "deploy-over-warm"):
        c.deploy_and_wait(model, c.other_release(model, fault.pick))  # a switch just now
    if fault.action == "cold-rollback" and model == BG:
        c.wait_cold(model)
    before = {m: c.model(m)["active_release"] for m in CAST.models}
    watch = LogWatch(c.daemon.log_path)
    started = time.monotonic()
    if fault.action.startswith("deploy"):
        target = c.other_release(model, fault.pick)
        operation = c.request(model, "deploy", {"release": target})
    elif fault.action.endswith("rollback"):
        target = c.model(model)["previous_release"]
        operation = c.request(model, "rollback", {"to": "previous"})
    else:
        target = before[model]
        retire = c.wait_for_operation(watch, model, {"retire"}, CAST.retire_after + ARM_TIMEOUT)
        assert retire is not None, f"no retire of {model} started"
        operation = retire
    out.change = f"{before[model]}->{target}"
    killed: list[dict[str, Any] | None] = [operation]
    first_kill = killed_at = arm_and_kill(c, fault, watch, operation, False, out)
    if fault.again is not None:
        watch = LogWatch(c.daemon.log_path)
        repair = c.wait_for_operation(watch, model, {"repair", "retire"}, REPAIR_TIMEOUT)
        if repair is None:
            out.notes.append(f"no repair of {model} started within {REPAIR_TIMEOUT:g} s")
        killed.append(repair)
        killed_at = arm_and_kill(c, fault, watch, repair, True, out)
    converged_at = c.wait_converged(fault)
    out.converge = converged_at - killed_at
    if fault.victim == "triton" and c.ready_at is not None:
        out.ready = c.ready_at - killed_at
    c.settle(out)
    check(c, fault, out, before, target, killed, (started, first_kill, converged_at))
    return out


def check(
    c: Campaign,
    fault: Fault,
    out: Outcome,
    before: dict[str, str],
    target: str,
    killed: list[dict[str, Any] | None],
    times: tuple[float, float, float],
) -> None:
    """What must hold once converged, and what must have held all along."""
    started, first_kill, converged_at = times
    model = fault.model
    out.converged_to = {m: c.model(m)["active_release"] for m in CAST.models}
    allowed = {before[model], target}
    if out.converged_to[model] not in allowed:
        out.findings.append(f"{model} serves {out.converged_to[model]}, not one of {allowed}")
    other = IP if model == BG else BG
    if out.converged_to[other] != before[other]:
        out.findings.append(f"{other}, untouched, went from {before[other]} to the other")
    for operation in killed:
        if operation is None:
            continue
        after = c.operation(operation["id"])
        out.statuses.append(after["status"])
        if fault.victim == "daemon" and after["status"] == "interrupted":
            if after["error"]["code"] != "interrupted":
                out.findings.append(f"{after['id']} interrupted with {after['error']['code']}")
        elif fault.victim == "daemon" and after["status"] != "succeeded":
            out.findings.append(f"{after['id']}, killed, ended {after['status']}")
        elif fault.victim == "triton" and after["status"] not in ("succeeded", "failed"):
            out.findings.append(f"{after['id']} ended {after['status']} under a Triton restart")

    assert c.load is not None
    calls = c.load.calls(start=started, end=converged_at)
    out.sent = len(calls)
    out.failed = sum(1 for call in calls if call.error is not None)
    failed_at = [call.started - first_kill for call in calls if call.error is not None]
    if failed_at:
        out.failed_when = f"(from {min(failed_at):+.2f} to {max(failed_at):+.2f} s of the kill)"
    for call in calls:
        releases = allowed if call.model == model else {before[call.model]}
        expected = {answer(call.model, r) for r in releases}
        if call.value is not None and call.value not in expected:
            out.findings.append(f"{call.model} answered {call.value}, not one of {expected}")
            break
    if fault.victim == "daemon" and out.failed:
        errors = sorted({call.error or "" for call in calls if call.error})[:3]
        out.findings.append(f"{out.failed} inference(s) failed with only the daemon down: {errors}")
    if fault.victim == "triton":
        early = [call for call in calls if call.error and call.ended < first_kill]
        if early:
            out.findings.append(f"{len(early)} inference(s) failed before Triton was killed")


@pytest.fixture
def campaign(tmp_path: Path, store: Path, own_triton: TritonFactory) -> Iterator[Campaign]:
    for model in CAST.models:
        for release in CAST.releases:
            k = answer(model, release)
            write_scale_release(store, model, release, k=k, init_sleep=INIT_SLEEP)
    running = Campaign(tmp_path / "root", store, own_triton, CAST)
    try:
        running.calibrate()
        running.load = TimedLoad(running.triton.grpc_url, CAST.models)
        running.load.start()
        for model in CAST.models:
            running.load.wait_for_answers(model, 10)
        yield running
    finally:
        running.stop()


def run(
    campaign: Campaign, faults: list[Fault], title: str, capsys: pytest.CaptureFixture[str]
) -> list[Outcome]:
    """Every fault in turn, a line each, the summary table; then no finding, and no failed
    inference since the last fault converged. Ends as an expected failure at an open finding."""
    print(f"{title}: seed {SEED}, plan:\n" + "\n".join(f.describe() for f in faults))
    outcomes = []
    for fault in faults:
        outcome = strike(campaign, fault)
        print(outcome.line())
        outcomes.append(outcome)
    with capsys.disabled():
        print("\n" + report(f"{title} (seed {SEED})", outcomes))
    assert [f"{o.fault.describe()}: {f}" for o in outcomes for f in o.findings] == []
    assert campaign.load is not None
    since = campaign.load.calls(start=campaign.converged_at)
    assert [call for call in since if call.error] == [], "inferences failed after the last fault"
    return outcomes


@pytest.mark.timeout(480)
def test_daemon_killed_anywhere_comes_back_serving_a_complete_release_without_failing_clients(
    campaign: Campaign, capsys: pytest.CaptureFixture[str]
) -> None:
    faults = plan(random.Random(SEED), "daemon", DAEMON_FAULTS, DAEMON_KILLS)

    outcomes = run(campaign, faults, "daemon kills", capsys)

    assert sum(o.fault.kills for o in outcomes) >= DAEMON_KILLS


def test_triton_killed_mid_operation_is_repaired_by_the_reconcile_loop_alone(
    campaign: Campaign, capsys: pytest.CaptureFixture[str]
) -> None:
    faults = plan(random.Random(SEED + 1), "triton", TRITON_FAULTS, TRITON_KILLS)

    outcomes = run(campaign, faults, "Triton kills", capsys)

    assert sum(o.fault.kills for o in outcomes) >= TRITON_KILLS
    assert len(campaign.daemons) == 1  # the one daemon lived through every Triton restart
    assert campaign.daemon.process.poll() is None
