"""GPU utilisation from a Prometheus instant query, against the real Prometheus.

One Prometheus serves the module: it scrapes a test exporter with two GPUs (0.5 and 0.97), and
the fixture hands it over only once both series are queryable, so every test reads a settled
answer and none polls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from controlplane.adapters.prometheus import PrometheusQuery
from devtools.launcher import free_port
from tests.support.gpu_exporter import GpuExporter
from tests.support.monitoring import Prometheus
from tests.support.polling import eventually

GPUS = {"GPU-a": 0.5, "GPU-b": 0.97}


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    with GpuExporter() as exporter:
        exporter.set(**GPUS)
        directory = tmp_path_factory.mktemp("prometheus")
        with Prometheus(directory, scrape_url=exporter.url, alertmanager_url=None) as prom:
            eventually(
                lambda: len(prom.query("nv_gpu_utilization")) == len(GPUS),
                30,
                "both GPUs scraped",
                every=0.2,
            )
            yield prom


def read(base_url: str, query: str) -> dict[str, float] | None:
    async def scenario() -> dict[str, float] | None:
        source = PrometheusQuery(base_url, query)
        try:
            return await source.gpu_utilization()
        finally:
            await source.close()

    return asyncio.run(scenario())


def test_utilization_per_gpu_by_uuid(prometheus: Prometheus) -> None:
    assert read(prometheus.url, "nv_gpu_utilization") == GPUS


def test_an_aggregate_is_keyed_by_its_empty_label_set(prometheus: Prometheus) -> None:
    average = read(prometheus.url, "avg(nv_gpu_utilization)")
    assert average is not None
    assert list(average) == [""]
    assert average[""] == pytest.approx(0.735)
    assert read(prometheus.url, "scalar(max(nv_gpu_utilization))") == {"": 0.97}


def test_series_without_a_gpu_uuid_are_keyed_by_their_labels(prometheus: Prometheus) -> None:
    answer = read(prometheus.url, "max by (job, instance) (nv_gpu_utilization)")
    assert answer is not None
    [(key, value)] = answer.items()
    assert key.startswith('{instance="127.0.0.1:')
    assert key.endswith('",job="triton"}')
    assert value == 0.97


def test_series_sharing_a_gpu_uuid_are_keyed_by_their_labels(prometheus: Prometheus) -> None:
    one = 'nv_gpu_utilization{gpu_uuid="GPU-a"}'
    answer = read(prometheus.url, f'label_replace({one}, "copy", "yes", "", "") or {one}')
    assert answer is not None
    assert sorted(answer.values()) == [0.5, 0.5]
    copy, original = sorted(answer)
    assert copy.startswith('{__name__="nv_gpu_utilization",copy="yes",gpu_uuid="GPU-a",')
    assert original.startswith('{__name__="nv_gpu_utilization",gpu_uuid="GPU-a",')


def test_a_query_no_series_matches_answers_empty(prometheus: Prometheus) -> None:
    assert read(prometheus.url, 'nv_gpu_utilization{gpu_uuid="GPU-none"}') == {}


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        pytest.param("avg(nv_gpu_utilization", "bad_data", id="syntax-error"),
        pytest.param("nv_gpu_utilization / 0", "not finite: '+Inf'", id="infinite"),
        pytest.param("0 / 0", "not finite: 'NaN'", id="nan"),
        pytest.param('"a string"', "unexpected result type 'string'", id="string-result"),
    ],
)
def test_an_answer_that_cannot_be_trusted_is_unknown(
    prometheus: Prometheus, caplog: pytest.LogCaptureFixture, query: str, reason: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="controlplane.adapters.prometheus"):
        assert read(prometheus.url, query) is None
    assert reason in caplog.text


def test_nothing_listening_is_unknown_and_the_log_holds_no_credentials(
    caplog: pytest.LogCaptureFixture,
) -> None:
    base_url = f"http://watcher:s3cret-password@127.0.0.1:{free_port()}"
    with caplog.at_level(logging.WARNING, logger="controlplane.adapters.prometheus"):
        assert read(base_url, "nv_gpu_utilization") is None
    assert "ConnectError" in caplog.text
    assert "s3cret-password" not in caplog.text


def test_a_failure_that_persists_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> list[dict[str, float] | None]:
        source = PrometheusQuery(f"http://127.0.0.1:{free_port()}", "nv_gpu_utilization")
        try:
            return [await source.gpu_utilization() for _ in range(3)]
        finally:
            await source.close()

    with caplog.at_level(logging.WARNING, logger="controlplane.adapters.prometheus"):
        assert asyncio.run(scenario()) == [None, None, None]
    assert len(caplog.records) == 1
