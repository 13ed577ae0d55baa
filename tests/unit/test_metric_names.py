"""Every metric the daemon exports follows Prometheus's conventions, and docs/metrics.md lists
each one with its type and labels.

The daemon's registry is walked after one report of every kind and a scrape's figures with
every part filled in, so each labelled family has its labels. (The same check runs over a real
daemon's ``/metrics``: tests/integration/test_metrics.py.)
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controlplane import __version__
from controlplane.adapters.telemetry import PrometheusTelemetry
from controlplane.domain.alerts import Receipt
from controlplane.domain.figures import (
    Figures,
    FleetFigures,
    FleetView,
    MemberStanding,
    ModelFigures,
)
from controlplane.domain.memory import LeakTrend, ResidueReport
from controlplane.domain.operations import (
    Operation,
    OperationKind,
    OperationStatus,
    Step,
    StepStatus,
    Trigger,
)
from controlplane.domain.refusals import RecordKind, RefusalReason
from controlplane.domain.rollback import RollbackOutcome, RollbackRecord
from controlplane.domain.rotation import OutReason
from controlplane.domain.slots import Slot, SlotState
from controlplane.domain.transfer import RetryCause
from controlplane.ports import TritonMemory
from tests.support.metric_conventions import exposed, problems

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def telemetry() -> PrometheusTelemetry:
    """The daemon's telemetry after one report of every kind, and a scrape's figures."""
    telemetry = PrometheusTelemetry()
    step = Step("fetch", StepStatus.SUCCEEDED, T0, T0 + timedelta(seconds=1), {"bytes_fetched": 9})
    operation = Operation(
        "op1",
        OperationKind.DEPLOY,
        "resnet",
        "r2",
        Trigger.API,
        OperationStatus.FAILED,
        T0,
        finished_at=T0 + timedelta(seconds=2),
        steps=(step,),
    )
    telemetry.operation_finished(operation)
    telemetry.rollback_recorded(
        RollbackRecord("rb1", "resnet", T0, Trigger.WATCHER, "hot", "r2", "r1", RollbackOutcome.CPU)
    )
    telemetry.rollback_suppressed("resnet")
    telemetry.alert_received(Receipt.NEW)
    telemetry.overload_evaluated("breach", 0.97)
    telemetry.residue_found(ResidueReport("resnet__blue", shm_segments=("seg",), shm_bytes=1))
    telemetry.memory_observed(
        TritonMemory(1, resident_bytes=10, shm_bytes=1, host_total_bytes=100),
        [LeakTrend("host", samples=3, growth=5, flagged=False)],
    )
    telemetry.repair_started("load")
    telemetry.job_restarted("reconcile")
    telemetry.store_retried(RetryCause.THROTTLED)
    slot = Slot("resnet__blue", SlotState.ACTIVE, "r2", Trigger.ALERT, "serving", T0)
    view = FleetView(T0, dict.fromkeys(MemberStanding, 1), {"resnet": False})
    telemetry.render(
        Figures(
            models=(
                ModelFigures(
                    "resnet",
                    "r2",
                    (slot,),
                    False,
                    True,
                    ("r2",),
                    out_of_rotation=OutReason.MEMORY_NOT_RETURNED,
                ),
            ),
            triton_up=True,
            jobs={"reconcile": True, "fleet-sync": False},
            not_serving=1,
            fleet=FleetFigures(
                False,
                T0,
                False,
                {"resnet": 4},
                view,
                refused={(RecordKind.DESIRED, RefusalReason.TIME_WITHOUT_ZONE): 1},
            ),
        )
    )
    return telemetry


def families(telemetry: PrometheusTelemetry) -> list[Metric]:
    return list(telemetry.registry.collect())


def test_every_metric_the_daemon_exports_follows_the_conventions(
    telemetry: PrometheusTelemetry,
) -> None:
    assert problems(families(telemetry)) == []


def test_the_build_info_names_this_version_python_and_tritonclient(
    telemetry: PrometheusTelemetry,
) -> None:
    [build] = [m for m in families(telemetry) if m.name == "controlplane_build"]
    [sample] = build.samples
    assert sample.name == "controlplane_build_info"
    assert sample.value == 1
    assert sample.labels["version"] == __version__
    assert re.fullmatch(r"3\.\d+\.\d+", sample.labels["python"])
    assert re.fullmatch(r"\d+\.\d+\.\d+", sample.labels["triton_client"])


class _Families(Collector):
    def __init__(self, *found: Metric) -> None:
        self.found = found

    def collect(self) -> Iterator[Metric]:
        yield from self.found


def _info(name: str, value: float, **labels: str) -> Metric:
    family = GaugeMetricFamily(name, "x", labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def _one(build: object) -> list[Metric]:
    registry = CollectorRegistry()
    if isinstance(build, Metric):
        registry.register(_Families(build))
    else:
        assert callable(build)
        build(registry)
    return list(registry.collect())


BROKEN: dict[str, object] = {
    "a gauge ending in _total": lambda r: Gauge("controlplane_models_total", "x", registry=r),
    "a ratio without _ratio": lambda r: Gauge("controlplane_gpu_utilization", "x", registry=r),
    "a ratio in percent": lambda r: Gauge("controlplane_gpu_usage_percent", "x", registry=r),
    "milliseconds": lambda r: Gauge("controlplane_load_milliseconds", "x", registry=r),
    "a duration with no unit": lambda r: Gauge("controlplane_load_duration", "x", registry=r),
    "a size with no unit": lambda r: Gauge("controlplane_host_memory", "x", registry=r),
    "no prefix": lambda r: Counter("operations", "x", registry=r),
    "the scrape's job label": lambda r: Gauge(
        "controlplane_job_up", "x", ["job"], registry=r
    ).labels(job="reconcile"),
    "an info that is not 1": _info("controlplane_thing_info", 2, release="r1"),
    "a build info without tritonclient": _info(
        "controlplane_build_info", 1, version="1", python="3.11.7"
    ),
}


@pytest.mark.parametrize("broken", BROKEN.values(), ids=BROKEN.keys())
def test_the_check_finds_each_kind_of_broken_name(broken: object) -> None:
    assert problems(_one(broken))


# --- docs/metrics.md ---------------------------------------------------------------------------

_ROW = re.compile(r"^\| `(controlplane_\w+)` \| (\w+) \|([^|]*)\|", re.MULTILINE)


def documented() -> dict[str, tuple[str, frozenset[str]]]:
    """Name -> (type, label names), from the tables of docs/metrics.md."""
    return {
        name: (kind, frozenset(re.findall(r"`(\w+)`", labels)))
        for name, kind, labels in _ROW.findall(DOCS.read_text())
    }


def test_docs_list_every_metric_with_its_type_and_labels(telemetry: PrometheusTelemetry) -> None:
    docs = documented()
    found = {
        m.name: ("info" if m.name.endswith("_info") else m.type, m.labels)
        for m in exposed(families(telemetry))
        if not m.name.endswith("_created")
    }
    assert found.keys() - docs.keys() == set(), "exported but not in docs/metrics.md"
    assert docs.keys() - found.keys() == set(), "in docs/metrics.md but not exported"
    wrong = {name: (docs[name], found[name]) for name in found if docs[name] != found[name]}
    assert wrong == {}, "docs/metrics.md (type, labels) differ from what is exported"
