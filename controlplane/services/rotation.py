"""Whether this member is in rotation: the models that keep it out now, and why.

A rolling update takes its member out of rotation before it unloads anything: ``/readyz``
answers 503 with the reason (``draining <model>``) for as long as the update runs, so the load
balancer in front of the fleet (a Service, HAProxy, a mesh) sends the model's requests to the
other members. The member returns when the update ends, whichever way it ends, but one: when
the old release's GPU memory did not come back after its unload, nothing is loaded (the load
would run out of memory), and the member stays out, *held*, until someone acts (a deploy or
rollback of the model that succeeds, or a restart of Triton and the daemon). The reconcile loop
leaves a held model alone: its repair would be the very load that was refused.

Back in rotation is not back in the load balancer's eyes at once: it sends the member requests
again only after its own checks pass (HAProxy's ``rise``, a probe's success threshold). So for
``rejoin_seconds`` after the member returns (a model's update ended, or it turned ready after
a start: a member killed mid-update comes back that way) it still tells the fleet it is out
(``rejoining``), while ``/readyz`` already answers 200: the next member does not leave while the
balancer has this one out too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from controlplane.domain.errors import MemoryNotReturned
from controlplane.domain.rotation import OutOfRotation, OutReason
from controlplane.ports import Clock

log = logging.getLogger(__name__)


class Rotation:
    def __init__(
        self,
        ready: asyncio.Event | None = None,
        *,
        clock: Clock | None = None,
        rejoin_seconds: float = 0.0,
    ) -> None:
        self._out: dict[str, OutOfRotation] = {}
        self._ready = ready  # set once start-up is done and the member converged; None: it is
        self._clock = clock  # None: no rejoin window
        self._rejoin_seconds = rejoin_seconds
        self._was_ready = ready is None or ready.is_set()
        self._back_at: float | None = None  # monotonic time it last returned

    def why_out(self) -> str | None:
        """Why the load balancer sends this member nothing now, as the fleet counts members
        out of rotation: ``starting`` (not converged yet), the models that keep it out, or
        ``rejoining`` (back, but maybe not yet in the balancer's eyes); None: in rotation."""
        reasons = [out.reason for _, out in sorted(self._out.items())]
        if self._ready is not None and not self._ready.is_set():
            return "; ".join(["starting", *reasons])  # an update of its own may run meanwhile
        if not self._was_ready:  # turned ready since the last look: it returns now
            self._was_ready = True
            self._returned()
        return "; ".join(reasons) or ("rejoining" if self._rejoining() else None)

    def _returned(self) -> None:
        if self._clock is not None:
            self._back_at = self._clock.monotonic()

    def _rejoining(self) -> bool:
        if self._clock is None or self._back_at is None:
            return False
        return self._clock.monotonic() - self._back_at < self._rejoin_seconds

    def reasons(self) -> dict[str, str]:
        """Why this member is out of rotation, by model; empty: it is in."""
        return {model: out.reason for model, out in sorted(self._out.items())}

    def kinds(self) -> dict[str, OutReason]:
        """The kind of each reason of :meth:`reasons`, by model: what metrics select on."""
        return {model: out.kind for model, out in sorted(self._out.items())}

    def out_of(self, model: str) -> OutOfRotation | None:
        """Why ``model`` keeps this member out of rotation now; None: it does not."""
        return self._out.get(model)

    def held(self, model: str) -> str | None:
        """Why ``model`` is held out of rotation after its operation ended; None: it is not."""
        out = self._out.get(model)
        return out.reason if out is not None and out.held else None

    @contextmanager
    def out(self, model: str) -> Iterator[None]:
        """Out of rotation for ``model`` while the block runs; back after, unless the block
        ended with :class:`MemoryNotReturned` (then held out)."""
        self._out[model] = OutOfRotation(OutReason.DRAINING, f"draining {model}")
        log.info("out of rotation: draining %s", model, extra={"model": model})
        try:
            yield
        except MemoryNotReturned as exc:
            reason = f"memory_not_returned: {exc.message}"
            self._out[model] = OutOfRotation(OutReason.MEMORY_NOT_RETURNED, reason)
            log.error(
                "staying out of rotation for %s: %s", model, exc.message, extra={"model": model}
            )
            raise
        except BaseException:
            self._back(model)
            raise
        self._back(model)

    def release(self, model: str) -> None:
        """A later operation on ``model`` succeeded: a hold on it is over."""
        out = self._out.get(model)
        if out is not None and out.held:
            self._back(model)

    def _back(self, model: str) -> None:
        if self._out.pop(model, None) is not None:
            self._returned()
            log.info("back in rotation (%s)", model, extra={"model": model})
