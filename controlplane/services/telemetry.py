"""The telemetry a service gets when nobody listens: every report is dropped.

Services take a :class:`~controlplane.ports.Telemetry`; unit tests and tools that do not
export metrics use :data:`NO_TELEMETRY`.
"""

from __future__ import annotations

from collections.abc import Sequence

from controlplane.domain.alerts import Receipt
from controlplane.domain.memory import LeakTrend, ResidueReport
from controlplane.domain.operations import Operation
from controlplane.domain.rollback import RollbackRecord
from controlplane.domain.transfer import RetryCause
from controlplane.ports import TritonMemory


class NoTelemetry:
    def operation_finished(self, operation: Operation) -> None:
        return None

    def rollback_recorded(self, record: RollbackRecord) -> None:
        return None

    def rollback_suppressed(self, model: str) -> None:
        return None

    def alert_received(self, receipt: Receipt) -> None:
        return None

    def overload_evaluated(self, verdict: str, value: float | None) -> None:
        return None

    def residue_found(self, report: ResidueReport) -> None:
        return None

    def memory_observed(self, memory: TritonMemory, trends: Sequence[LeakTrend]) -> None:
        return None

    def repair_started(self, action: str) -> None:
        return None

    def job_restarted(self, job: str) -> None:
        return None

    def store_retried(self, cause: RetryCause) -> None:
        return None

    def signature_refused(self, model: str, code: str) -> None:
        return None


NO_TELEMETRY = NoTelemetry()
