"""``/metrics``: what the daemon did and what it holds, in Prometheus's text format.

Owns every use of ``prometheus_client`` for export (the Triton metrics reader only parses).
Events reported by the services (:class:`~controlplane.ports.Telemetry`) update counters,
histograms and gauges as they happen; what serving looks like now (the active release of each
model, the state of each slot, whether each serves what it should, the fleet, which background
jobs run) is handed to :meth:`render` at scrape time as one
:class:`~controlplane.domain.figures.Figures` (series: :mod:`.telemetry_figures`), read then, so
it is never stale and survives a restart. The registry is this object's own, not the
process-wide default, so two daemons in one process (tests) do not share series.

Names follow Prometheus conventions (docs/metrics.md lists them all, and a test holds every
exported name to them): a ``controlplane_`` prefix; base units as suffixes (``_seconds``,
``_bytes``, ``_ratio`` for a fraction of 1); ``_total`` on counters and nothing else; ``_info``
on gauges of 1 whose labels carry the facts (``controlplane_build_info``). Labels have bounded
values only (kinds, outcomes, triggers, step names, model, slot and latched release names,
verdicts, retry causes); free text such as a rollback's reason is never a label.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from controlplane import __version__
from controlplane.adapters.telemetry_figures import FiguresCollector
from controlplane.adapters.triton.protocol import TRITONCLIENT_VERSION
from controlplane.domain.alerts import Receipt
from controlplane.domain.figures import Figures
from controlplane.domain.memory import RESIDUE_KINDS, LeakTrend, ResidueReport
from controlplane.domain.operations import Operation, Trigger
from controlplane.domain.rollback import RollbackRecord
from controlplane.domain.signatures import SIGNATURE_CODES
from controlplane.domain.transfer import RetryCause, retry_cause
from controlplane.ports import TritonMemory

# From a cached re-point (ms) to a big model's load (minutes).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
VERDICTS = ("breach", "healthy", "unknown")
ROLLBACK_REASONS = {
    Trigger.WATCHER: "gpu_overload",
    Trigger.ALERT: "alert",
    Trigger.API: "manual",
    Trigger.CLI: "manual",
}


class PrometheusTelemetry:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        Info(
            "controlplane_build",
            "The daemon's version, its Python, and the tritonclient whose protos it speaks "
            "(always 1).",
            registry=r,
        ).info(build_labels())
        self._declare_operations(r)
        self._declare_rollbacks(r)
        self._declare_memory(r)
        self._declare_jobs_and_store(r)
        self._figures = FiguresCollector()
        r.register(self._figures)

    def _declare_operations(self, r: CollectorRegistry) -> None:
        """Operations, their steps, and the bytes they downloaded."""
        self._operations = Counter(
            "controlplane_operations",
            "Operations finished, by model, kind, outcome (succeeded, failed, interrupted) and "
            "trigger.",
            ["model", "kind", "outcome", "trigger"],
            registry=r,
        )
        self._operation_seconds = Histogram(
            "controlplane_operation_duration_seconds",
            "Wall time of finished operations, by kind.",
            ["kind"],
            buckets=BUCKETS,
            registry=r,
        )
        self._step_seconds = Histogram(
            "controlplane_step_duration_seconds",
            "Wall time of operation steps (fetch, verify, place, load, preflight, switch, "
            "drain, unload, ...), by step.",
            ["step"],
            buckets=BUCKETS,
            registry=r,
        )
        self._downloaded = Counter(
            "controlplane_downloaded_bytes",
            "Bytes downloaded from the store (bytes found in the content cache not counted).",
            registry=r,
        )

    def _declare_rollbacks(self, r: CollectorRegistry) -> None:
        """Rollbacks, and the alerts and verdicts that start them."""
        self._rollbacks = Counter(
            "controlplane_rollbacks",
            "Rollbacks by model, trigger, outcome (fallback, cpu, failed) and reason "
            "(gpu_overload, alert, manual).",
            ["model", "trigger", "outcome", "reason"],
            registry=r,
        )
        self._suppressed = Counter(
            "controlplane_rollback_triggers_suppressed",
            "Automatic rollback triggers held back by the cooldown, by model.",
            ["model"],
            registry=r,
        )
        self._alerts = Counter(
            "controlplane_alerts_received",
            "Alertmanager alerts received, by receipt (new, duplicate, resolved).",
            ["receipt"],
            registry=r,
        )
        self._verdict = Gauge(
            "controlplane_overload_verdict",
            "The overload watcher's current verdict: 1 on the current one, 0 on the others.",
            ["verdict"],
            registry=r,
        )
        self._utilization = Gauge(
            "controlplane_gpu_utilization_ratio",
            "GPU utilisation the overload watcher last sampled, in [0, 1] (NaN when unknown).",
            registry=r,
        )
        for receipt in Receipt:
            self._alerts.labels(receipt=receipt.value)
        for verdict in VERDICTS:
            self._verdict.labels(verdict=verdict).set(0)
        self._utilization.set(float("nan"))

    def _declare_memory(self, r: CollectorRegistry) -> None:
        """What unloads leave behind, and how Triton's memory grows."""
        self._residue = Counter(
            "controlplane_residue_findings",
            "Residue found after unloads, by kind (open_files, shm, processes, gpu_memory).",
            ["kind"],
            registry=r,
        )
        self._resident = Gauge(
            "controlplane_triton_resident_memory_bytes",
            "Triton's resident memory plus shared memory in use, after the last swap.",
            registry=r,
        )
        self._host_total = Gauge(
            "controlplane_host_memory_total_bytes", "The machine's memory (MemTotal).", registry=r
        )
        self._growth = Gauge(
            "controlplane_triton_memory_growth_bytes",
            "Growth of Triton's memory over the last N swaps, by kind (host, gpu).",
            ["kind"],
            registry=r,
        )
        for kind in RESIDUE_KINDS:
            self._residue.labels(kind=kind)

    def _declare_jobs_and_store(self, r: CollectorRegistry) -> None:
        """Repairs, restarted jobs, store retries, refused signatures."""
        self._repairs = Counter(
            "controlplane_repairs",
            "Repairs the reconcile loop started, by action (load, repoint, redeploy, remove): "
            "what should serve had drifted from what Triton serves.",
            ["action"],
            registry=r,
        )
        self._job_restarts = Counter(
            "controlplane_job_restarts",
            "Background jobs (reconcile, release-watcher, overload-watcher, ...) that failed or "
            "ended and were started again, by job name (label ``name``: Prometheus keeps ``job`` "
            "for the scrape job).",
            ["name"],
            registry=r,
        )
        for action in ("load", "repoint", "redeploy", "remove"):
            self._repairs.labels(action=action)
        self._store_retries = Counter(
            "controlplane_store_retries",
            "Store requests tried again after a transient fault, by cause (throttled, "
            "server_error, connection, timeout, corrupt, other).",
            ["cause"],
            registry=r,
        )
        for cause in RetryCause:
            self._store_retries.labels(cause=cause.value)
        self._signature_refusals = Counter(
            "controlplane_signature_refusals",
            "Releases refused for their signature, by code (signature_missing, "
            "signature_invalid, signature_unbound, unknown_signer).",
            ["code"],
            registry=r,
        )
        for code in SIGNATURE_CODES:
            self._signature_refusals.labels(code=code)

    # --- Telemetry ----------------------------------------------------------------------

    def operation_finished(self, operation: Operation) -> None:
        kind = operation.kind.value
        self._operations.labels(
            model=operation.model,
            kind=kind,
            outcome=operation.status.value,
            trigger=operation.trigger.value,
        ).inc()
        if operation.duration_seconds is not None:
            self._operation_seconds.labels(kind=kind).observe(operation.duration_seconds)
        for step in operation.steps:  # once, as the operation ends: one call, not one a step
            if step.duration_seconds is not None:
                self._step_seconds.labels(step=step.name).observe(step.duration_seconds)
            fetched = step.detail.get("bytes_fetched")
            if step.name == "fetch" and isinstance(fetched, int) and fetched > 0:
                self._downloaded.inc(fetched)

    def rollback_recorded(self, record: RollbackRecord) -> None:
        self._rollbacks.labels(
            model=record.model,
            trigger=record.trigger.value,
            outcome=record.outcome.value,
            reason=ROLLBACK_REASONS.get(record.trigger, "other"),
        ).inc()

    def rollback_suppressed(self, model: str) -> None:
        self._suppressed.labels(model=model).inc()

    def alert_received(self, receipt: Receipt) -> None:
        self._alerts.labels(receipt=receipt.value).inc()

    def overload_evaluated(self, verdict: str, value: float | None) -> None:
        for known in VERDICTS:
            self._verdict.labels(verdict=known).set(1 if known == verdict else 0)
        self._utilization.set(float("nan") if value is None else value)

    def residue_found(self, report: ResidueReport) -> None:
        for kind, count in report.findings().items():
            if count:
                self._residue.labels(kind=kind).inc(count)

    def memory_observed(self, memory: TritonMemory, trends: Sequence[LeakTrend]) -> None:
        if memory.host_bytes is not None:
            self._resident.set(memory.host_bytes)
        if memory.host_total_bytes is not None:
            self._host_total.set(memory.host_total_bytes)
        for trend in trends:
            if trend.growth is not None:
                self._growth.labels(kind=trend.kind).set(trend.growth)

    def repair_started(self, action: str) -> None:
        self._repairs.labels(action=action).inc()

    def job_restarted(self, job: str) -> None:
        self._job_restarts.labels(name=job).inc()

    def store_retried(self, cause: RetryCause) -> None:
        self._store_retries.labels(cause=retry_cause(cause).value).inc()

    def signature_refused(self, model: str, code: str) -> None:
        self._signature_refusals.labels(code=code).inc()

    # --- for the API ----------------------------------------------------------------------

    def render(self, figures: Figures) -> tuple[bytes, str]:
        """The exposition text and its content type, with the figures of this scrape."""
        for job in figures.jobs:
            self._job_restarts.labels(name=job)  # at 0 from the first scrape: `increase` sees 1
        self._figures.figures = figures
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def build_labels() -> dict[str, str]:
    """``controlplane_build_info``'s labels: this package, Python, and the tritonclient whose
    compiled protos the daemon speaks Triton's API with (generated at build time)."""
    return {
        "version": __version__,
        "python": platform.python_version(),
        "triton_client": TRITONCLIENT_VERSION,
    }
