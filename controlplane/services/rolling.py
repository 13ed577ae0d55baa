"""Rolling and auto: updates of a model that fits once in GPU memory, one member at a time.

Blue-green loads the new release beside the serving one; a model that takes most of a GPU (an
LLM backend reserves ~90 % of it on purpose) cannot have two loaded. ``rolling`` keeps
blue-green's layout (two slots and an alias, so one deploy can go either way) and changes the
order: fetch and verify while the old release serves, then, holding a turn out of rotation
(:mod:`.fleet_turns`):

drain (``/readyz`` 503 ``draining <model>``, ``rollout.unready_seconds`` for the load balancer
to notice, then Triton's pending requests at 0, within ``drain_timeout_seconds``) -> unload
(the old slot, its dir kept) -> memory (wait until the new release fits in the GPU memory the
old one gave back, within ``memory.return_seconds``) -> load -> preflight (and ``stress`` when
the model asks for it: on the new release alone) -> switch -> record, and back in rotation.

``auto`` checks the headroom first: blue-green when the new release fits beside the serving
one, rolling when it does not; the ``strategy`` step says which and why.

Invariants:

* Nothing leaves rotation before the release is fetched and verified here: a release that is
  refused is refused while the old one serves.
* A failure after the unload (load, preflight, switch) loads the old release back from its dir
  (``restore``), points the alias at it and only then returns to rotation.
* Memory that did not come back stops the update before any load (``memory_not_returned``):
  the member stays out of rotation, held (:mod:`.rotation`), and the reconcile loop does not
  load the old release either.
* A fleet of one cannot update a model that fits once without an outage: refused
  (``would_be_an_outage``) unless the model sets ``allow_downtime``; then the operation
  records how long the model did not serve.
* Killed at any point, the member's records still say the old slot is active: start-up
  reconcile loads it from its dir, the turn lapses with the process, and the fleet sync starts
  the update again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from controlplane.domain import headroom
from controlplane.domain.errors import DowntimeRefused, MemoryNotReturned, TritonTimeout
from controlplane.domain.slots import Slot, SlotState
from controlplane.domain.smoke import SmokeSample
from controlplane.domain.traffic import Strategy
from controlplane.domain.turns import RollingPolicy
from controlplane.ports import MetricsSource, TritonProcesses
from controlplane.services.bluegreen import BlueGreen
from controlplane.services.fleet_turns import FleetTurns
from controlplane.services.memory import check_headroom
from controlplane.services.prepare import PreparedRelease
from controlplane.services.rotation import Rotation
from controlplane.services.runner import Run
from controlplane.services.slots import SlotSnapshot, serving_after
from controlplane.services.tracker import OperationTracker
from controlplane.timing import poll

log = logging.getLogger(__name__)
DRAIN_POLL = 0.2  # s between looks at Triton's pending requests
MEMORY_POLL = 0.5  # s between looks at the GPU's figures
LIVE_POLL = 0.5  # s between looks at Triton's liveness after a restart
STOP_GRACE = 10.0  # s between SIGTERM and SIGKILL when restart-triton stops Triton


class Rolling(BlueGreen):
    """``rolling`` (``always``) or ``auto``, on blue-green's slots and repairs."""

    def __init__(
        self,
        *,
        always: bool,
        rotation: Rotation,
        turns: FleetTurns | None,
        metrics: MetricsSource,
        rolling_for: Callable[[str], RollingPolicy],
        processes: TritonProcesses | None = None,
        **blue_green: Any,
    ) -> None:
        super().__init__(**blue_green)
        self.kind = Strategy.ROLLING if always else Strategy.AUTO
        self._always = always
        self._rotation = rotation
        self._turns = turns
        self._metrics = metrics
        self._rolling_for = rolling_for
        self._processes = processes  # memory.on_not_returned: restart-triton stops Triton

    async def deploy(
        self, run: Run, snapshot: SlotSnapshot, *, revision: str | None, force: bool
    ) -> None:
        await self._update(run, snapshot, revision=revision, force=force)
        self._rotation.release(run.model)  # it serves as asked: a hold on it is over

    async def _update(
        self, run: Run, snapshot: SlotSnapshot, *, revision: str | None, force: bool
    ) -> None:
        active = snapshot.active()
        if active is None or active.release is None:  # nothing serves: nothing to drain
            await super().deploy(run, snapshot, revision=revision, force=force)
            return
        tracker, model = run.tracker, run.model
        release = run.operation.release
        assert release is not None
        index = await self._index()
        target = self._choose_target(snapshot, active, index)
        prepared = await self._preparer.prepare(
            tracker, model, release, target=target.name, revision=revision
        )
        sample = await self._check(tracker, prepared, target)
        target = await self._free(tracker, snapshot, index, target, active, release)
        if not self._always and await self._fits_beside(tracker, prepared, force):
            await self._load_and_switch(run, snapshot, prepared, target, active, sample)
            return
        policy = self._rolling_for(model)
        outage = await self._refuse_an_outage(tracker, model, policy)
        assert self._turns is not None or outage
        if self._turns is None:
            await self._roll(run, snapshot, prepared, target, active, sample, policy, force, outage)
        else:
            async with self._turns.turn(
                tracker,
                model,
                release,
                max_unavailable=policy.max_unavailable,
                timeout=policy.turn_timeout,
            ):
                await self._roll(
                    run, snapshot, prepared, target, active, sample, policy, force, outage
                )

    async def _fits_beside(
        self, tracker: OperationTracker, prepared: PreparedRelease, force: bool
    ) -> bool:
        """``auto``'s choice, said in the ``headroom`` step: blue-green when the release fits
        beside the serving one (or the deploy says force), rolling when it does not."""
        refuse = force  # force: blue-green, loading anyway, as force always meant
        fits = await check_headroom(tracker, self._headroom, prepared, force=force, refuse=refuse)
        tracker.detail(
            strategy="blue-green" if fits else "rolling",
            strategy_why="the new release fits beside the serving one"
            if fits
            else "the new release does not fit beside the serving one: one member at a time, "
            "out of rotation",
        )
        return fits

    async def _refuse_an_outage(
        self, tracker: OperationTracker, model: str, policy: RollingPolicy
    ) -> bool:
        """Whether the update is an outage (no other member serves the model) that the
        model accepts (``allow_downtime``); refused when it does not accept it."""
        others = 0 if self._turns is None else await self._turns.others_alive()
        if others > 0:
            return False
        if not policy.allow_downtime:
            raise DowntimeRefused(
                f"{model} fits once in GPU memory and no other member of the fleet serves it: "
                "updating it here means it serves nothing while the old release unloads and "
                "the new one loads. Add members (a fleet of two or more rolls without an "
                f"outage), or set allow_downtime: true for {model} to accept the downtime"
            )
        tracker.detail(downtime="allowed (allow_downtime): no other member serves it")
        return True

    async def _roll(
        self,
        run: Run,
        snapshot: SlotSnapshot,
        prepared: PreparedRelease,
        target: Slot,
        active: Slot,
        sample: SmokeSample | None,
        policy: RollingPolicy,
        force: bool,
        outage: bool,
    ) -> None:
        """Out of rotation, the update; back in rotation after. ``outage``: no other member
        serves the model (``allow_downtime``), so the record says how long it served nowhere."""
        tracker, model = run.tracker, run.model
        left = self._clock.monotonic()
        try:
            with self._rotation.out(model):
                slot, not_serving = await self._unload_and_load(
                    run, prepared, target, active, sample, policy, force
                )
        except (MemoryNotReturned, asyncio.CancelledError):
            raise  # held out of rotation, or the daemon is going away: no rejoin to wait for
        except BaseException:
            await self._rejoin(tracker, policy)  # restored: in rotation before the turn goes
            raise
        async with tracker.step("record"):
            await self._record_rolled(tracker, snapshot, new=slot, old=active)
            tracker.detail(out_of_rotation_seconds=round(self._clock.monotonic() - left, 3))
            if outage:
                tracker.detail(downtime_seconds=not_serving)
        await self._rejoin(tracker, policy)

    async def _unload_and_load(
        self,
        run: Run,
        prepared: PreparedRelease,
        target: Slot,
        active: Slot,
        sample: SmokeSample | None,
        policy: RollingPolicy,
        force: bool,
    ) -> tuple[Slot, float]:
        """Out of rotation: drain, unload, memory back, load, preflight, switch; the old
        release restored on a failure past the unload. The new slot, serving, and the seconds
        from the unload to the switch (when this member served neither release)."""
        tracker = run.tracker
        await self._drain(tracker, active, policy)
        before = await self._gpu_used()
        unloaded = self._clock.monotonic()
        await self._unload_old(run, active)
        await self._memory_back(tracker, prepared, active, before, policy)
        try:
            await check_headroom(tracker, self._headroom, prepared, force=force)
            slot = await self._place_and_load(run, prepared, target, first=False)
            try:
                signature = await self._alias.preflight(tracker, slot, sample)
                # Alone: the serving release is unloaded, so no side-by-side comparison; errors
                # and memory growth still refuse it.
                await self._stress_test(run, slot, None, sample)
                async with tracker.step("switch"):
                    await self._alias.switch(tracker, slot.name, signature, sample, back_to=None)
            except BaseException as exc:
                await self._after_failed_switch(run, slot, exc, first=False)
                raise
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                await self._restore(tracker, active, exc)
            raise
        return slot, round(self._clock.monotonic() - unloaded, 3)

    async def _rejoin(self, tracker: OperationTracker, policy: RollingPolicy) -> None:
        """Back in rotation: the turn is kept ``rollout.unready_seconds`` more, the load
        balancer's time to send this member requests again (HAProxy's ``rise``, a probe's
        success threshold), so that the next member does not leave while this one is still
        out in the balancer's eyes."""
        async with tracker.step("rejoin"):
            await self._clock.sleep(policy.unready_seconds)
            tracker.detail(waited_seconds=policy.unready_seconds)

    async def _drain(self, tracker: OperationTracker, active: Slot, policy: RollingPolicy) -> None:
        """Out of rotation already: the load balancer's time to notice, then no request
        pending in Triton for the model (the alias, and the slot behind it)."""
        model = tracker.operation.model
        async with tracker.step("drain"):
            await self._clock.sleep(policy.unready_seconds)
            pending: int | None = None

            async def drained() -> bool:
                nonlocal pending
                counts = [await self._metrics.pending_requests(n) for n in (model, active.name)]
                pending = None if None in counts else sum(c or 0 for c in counts)
                return not pending

            done = await poll(self._clock, drained, every=DRAIN_POLL, timeout=policy.drain_timeout)
            tracker.detail(
                unready_seconds=policy.unready_seconds,
                pending=pending,
                timed_out=not done,
            )

    async def _unload_old(self, run: Run, active: Slot) -> None:
        """The serving slot unloaded, its dir kept (for a restore); still recorded ACTIVE, so
        a daemon killed from here on loads it back at start-up."""
        tracker = run.tracker
        async with tracker.step("unload"):
            tracker.detail(slot=active.name, release=active.release)
            self.retire_timers.cancel(active.name)
            async with self._memory.unloading(active.name, tracker):
                try:  # Triton away (TritonUnavailable) is said as such, not as memory
                    await self._triton.unload(active.name)
                    await self._triton.wait_unavailable(active.name, self._bounds.unload)
                except TritonTimeout as exc:
                    raise MemoryNotReturned(
                        f"Triton did not unload {active.name} within {self._bounds.unload:g} "
                        "s, so its memory is still held; not loading the new release beside it"
                    ) from exc

    async def _memory_back(
        self,
        tracker: OperationTracker,
        prepared: PreparedRelease,
        old: Slot,
        before: dict[str, int] | None,
        policy: RollingPolicy,
    ) -> None:
        """Until the new release fits in the GPU memory the old one gave back."""
        async with tracker.step("memory"):
            figures = self._headroom.figures
            if figures is None or not prepared.summary.may_use_gpu:
                tracker.detail(checked=False)
                return
            need, basis = headroom.estimate_need(
                prepared.size_bytes, self._headroom.factor, prepared.summary.memory_hint
            )
            seen: dict[str, int] = {}

            async def back() -> bool:
                nonlocal seen
                gpus = await figures.gpu_memory()
                if not gpus:  # no GPU, or unreadable: nothing to wait for (the headroom says)
                    return True
                seen = {uuid: g.used for uuid, g in gpus.items()}
                return any(g.free >= need for g in gpus.values())

            started = self._clock.monotonic()
            done = await poll(self._clock, back, every=MEMORY_POLL, timeout=policy.return_seconds)
            restart: dict[str, Any] | None = None
            if not done and policy.restart_triton:
                restart = await self._restart_triton(tracker, policy)
                if restart["restarted"]:
                    done = await poll(
                        self._clock, back, every=MEMORY_POLL, timeout=policy.return_seconds
                    )
            tracker.detail(
                need_bytes=need,
                basis=basis,
                gpu_used_before_bytes=before,
                gpu_used_bytes=seen,
                waited_seconds=round(self._clock.monotonic() - started, 3),
            )
            if restart is not None:
                tracker.detail(restart_triton=restart)
            if not done:
                raise MemoryNotReturned(_not_back(old, need, basis, before, seen, policy, restart))

    async def _restart_triton(
        self, tracker: OperationTracker, policy: RollingPolicy
    ) -> dict[str, Any]:
        """``memory.on_not_returned: restart-triton``: stop Triton's process (what it held on
        the GPU goes with it), for its supervisor (the kubelet, systemd) to start it again,
        and wait until it answers live. Every model it served is unloaded by the restart;
        the reconcile loop loads the others back. What happened, for the ``memory`` step."""
        model = tracker.operation.model
        started = self._clock.monotonic()
        log.warning(
            "%s: the GPU memory did not come back after the unload; restarting Triton "
            "(memory.on_not_returned: restart-triton)",
            model,
            extra={"model": model, "operation_id": tracker.operation.id},
        )
        if self._processes is None:
            why: str | None = "the daemon cannot see Triton's processes"
        else:
            why = await asyncio.to_thread(self._processes.stop, STOP_GRACE)
        if why is not None:
            return {"restarted": False, "why": why}
        live = await poll(
            self._clock, self._triton.is_live, every=LIVE_POLL, timeout=policy.restart_seconds
        )
        took = round(self._clock.monotonic() - started, 3)
        if not live:
            return {
                "restarted": False,
                "why": f"Triton was stopped but did not answer live within "
                f"{policy.restart_seconds:g} s (memory.restart_seconds): nothing restarted "
                "it (the kubelet or systemd should)",
                "seconds": took,
            }
        log.warning("%s: Triton is live again after %.1f s", model, took, extra={"model": model})
        return {"restarted": True, "seconds": took}

    async def _restore(self, tracker: OperationTracker, active: Slot, exc: BaseException) -> None:
        """After a failure past the unload: the old release loaded again from its dir, the
        alias on it, before the member returns to rotation."""
        model = tracker.operation.model
        async with tracker.step("restore"):
            tracker.detail(
                slot=active.name, release=active.release, after=getattr(exc, "code", "error")
            )
            log.warning(
                "%s: the update failed after the unload (%s); loading %s back",
                model,
                getattr(exc, "code", exc),
                active.release,
                extra={"model": model, "operation_id": tracker.operation.id},
            )
            await self._triton.load(active.name)
            await self._alias.point(model, active.name)
            await self._triton.smoke(model, None)

    async def _record_rolled(
        self, tracker: OperationTracker, snapshot: SlotSnapshot, *, new: Slot, old: Slot
    ) -> None:
        """What serves and the new active slot, the old one unloaded: one transaction; then
        the old dir removed (a rollback fetches it again, from the cache when it can)."""
        model, trigger = snapshot.model, tracker.operation.trigger
        release = tracker.operation.release or ""
        serving = serving_after(snapshot, release)
        self.retire_timers.cancel(new.name)
        reason = "unloaded by a rolling update"
        unloading = self._slots.moved(old, SlotState.UNLOADING, trigger, reason)
        unloaded = self._slots.moved(unloading, SlotState.UNAVAILABLE, trigger, reason)
        active = self._slots.moved(new, SlotState.ACTIVE, trigger, f"serving {release}")
        await self._slots.commit(model, active, unloaded, serving=serving)
        # Unloaded already (the unload step): take_down only removes its dir now.
        await self._freer.take_down(tracker, unloaded, "replaced by a rolling update")
        tracker.detail(active=release, previous=serving.previous, slot=new.name)

    async def _gpu_used(self) -> dict[str, int] | None:
        figures = self._headroom.figures
        if figures is None:
            return None
        gpus = await figures.gpu_memory()
        return None if gpus is None else {uuid: g.used for uuid, g in gpus.items()}


def _not_back(
    old: Slot,
    need: int,
    basis: str,
    before: dict[str, int] | None,
    seen: dict[str, int],
    policy: RollingPolicy,
    restart: dict[str, Any] | None,
) -> str:
    used = ", ".join(
        f"GPU {uuid} used {headroom.size_text(before.get(uuid, 0) if before else 0)} before the "
        f"unload and {headroom.size_text(now)} now"
        for uuid, now in sorted(seen.items())
    )
    said = (
        f"the GPU memory {old.release} held did not come back within "
        f"{policy.return_seconds:g} s of its unload ({used}); the new release needs about "
        f"{headroom.size_text(need)} ({basis}). Not loading it (it would run out of memory): "
        "this member stays out of rotation. "
    )
    if restart is None:
        return (
            said
            + "Restart Triton (or set memory.on_not_returned: restart-triton), then deploy again"
        )
    if not restart["restarted"]:
        return (
            said + f"Triton could not be restarted: {restart['why']}. Restart it, then deploy again"
        )
    return said + (
        "Triton was restarted and the memory is still not free: something else holds the GPU "
        "(nvidia-smi shows what); free it, then deploy again"
    )
