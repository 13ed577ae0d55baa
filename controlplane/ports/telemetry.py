"""The telemetry seam: what the use cases report as it happens, for ``/metrics``.

Reporting never fails an operation: every method is cheap and never raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from controlplane.domain.alerts import Receipt
from controlplane.domain.memory import LeakTrend, ResidueReport
from controlplane.domain.operations import Operation
from controlplane.domain.rollback import RollbackRecord
from controlplane.domain.transfer import RetryCause
from controlplane.ports.triton import TritonMemory


class Telemetry(Protocol):
    """What the use cases report as it happens, for ``/metrics``. Every method is cheap and
    never raises: telemetry must not fail an operation."""

    def operation_finished(self, operation: Operation) -> None:
        """Its outcome, its duration and each of its steps'."""
        ...

    def rollback_recorded(self, record: RollbackRecord) -> None: ...

    def rollback_suppressed(self, model: str) -> None: ...

    def alert_received(self, receipt: Receipt) -> None: ...

    def overload_evaluated(self, verdict: str, value: float | None) -> None: ...

    def residue_found(self, report: ResidueReport) -> None: ...

    def memory_observed(self, memory: TritonMemory, trends: Sequence[LeakTrend]) -> None: ...

    def repair_started(self, action: str) -> None:
        """The reconcile loop started a repair (load, repoint, redeploy, remove)."""
        ...

    def job_restarted(self, job: str) -> None:
        """A supervised background job failed (or ended) and is started again."""
        ...

    def store_retried(self, cause: RetryCause) -> None:
        """A store request is being tried again, for ``cause``."""
        ...

    def signature_refused(self, model: str, code: str) -> None:
        """A release of ``model`` was refused for its signature (``code``: signature_missing,
        signature_invalid, signature_unbound, unknown_signer)."""
        ...
