"""Automatic rollback: where GPU utilisation is read, what counts as an overload, and the
budgets of each step of the rollback chain.

The threshold is checked against its unit with the evaluator's own rule, and a source that
cannot work as set (percent from Triton, which exports a ratio; Prometheus without a URL) is
refused at start-up, not found out at the first overload.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from controlplane.domain.evaluator import check_threshold
from controlplane.settings.group import Group


class RollbackSettings(Group):
    source: Literal["triton", "prometheus", "none"] = Field(
        "triton",
        description="Where the overload watcher reads GPU utilisation: triton (its /metrics, "
        "no Prometheus needed), prometheus (an instant query) or none (alerts only).",
    )
    metrics_url: str | None = Field(
        None, description="source triton: the /metrics to scrape. Default: triton.metrics_url."
    )
    prometheus_url: str | None = Field(
        None, description="source prometheus: base URL of Prometheus, e.g. http://prometheus:9090."
    )
    query: str = Field(
        "nv_gpu_utilization",
        description="source prometheus: PromQL giving GPU utilisation, one series per GPU.",
    )
    unit: Literal["ratio", "percent"] = Field(
        "ratio",
        description="Unit of the samples and of the threshold: ratio in [0, 1] (Triton's "
        "nv_gpu_utilization) or percent (e.g. DCGM_FI_DEV_GPU_UTIL).",
    )
    threshold: float = Field(
        0.95, gt=0, description="Overload: every sample in the window above this (in unit)."
    )
    window_seconds: float = Field(
        10.0, gt=0, description="How long utilisation must stay above the threshold."
    )
    interval_seconds: float = Field(
        1.0, gt=0, description="How often the watcher samples; gaps over 2x this hold (unknown)."
    )
    aggregate: Literal["any", "all", "mean"] = Field(
        "any",
        description="Several GPUs: any (the hottest breaches), all (every one must), or mean.",
    )
    cooldown_seconds: float = Field(
        300.0,
        ge=0,
        description="After an automatic rollback, further triggers on that model "
        "are counted, not acted on, for this long.",
    )
    fallback_budget_seconds: float = Field(
        3.0,
        gt=0,
        description="Time for a warm fallback (its slot still loaded: a re-point) to serve "
        "before the CPU step.",
    )
    cold_fallback_budget_seconds: float = Field(
        120.0,
        gt=0,
        description="Time for a cold fallback (its slot retired: a load) to serve before the "
        "CPU step; size it to the model's load time. keep_fallback_warm avoids the load.",
    )
    cpu_budget_seconds: float = Field(
        2.0, gt=0, description="Time for the CPU-only reload before the rollback is failed."
    )
    scope: Literal["fleet", "member"] = Field(
        "fleet",
        description="What an automatic rollback changes: fleet (this member rolls back, then "
        "the fleet's desired state moves to the fallback and the release is latched degraded "
        "for every member) or member (only the member that saw the overload).",
    )
    alert_label: str = Field(
        "model",
        pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$",
        description="Alert label naming the model to roll back; alerts without it act on every "
        "model that has a fallback.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> RollbackSettings:
        try:
            check_threshold(self.threshold, unit=self.unit)
        except ValueError as exc:
            raise ValueError(f"rollback.threshold: {exc}") from None
        if self.source == "triton" and self.unit != "ratio":
            raise ValueError(
                "rollback.unit is percent, but Triton exports nv_gpu_utilization as a ratio in "
                "[0, 1]: use unit ratio (threshold 0.95 for 95 %), or source prometheus"
            )
        if self.source == "prometheus" and not self.prometheus_url:
            raise ValueError(
                "rollback.source is prometheus but rollback.prometheus_url is not set "
                "(CONTROLPLANE_ROLLBACK__PROMETHEUS_URL, e.g. http://prometheus:9090)"
            )
        return self

    @property
    def threshold_ratio(self) -> float:
        return self.threshold / 100 if self.unit == "percent" else self.threshold
