"""Prometheus's naming conventions, as a check over metric families.

The same check runs over the daemon's own registry (every family, whether or not a sample
exists yet) and over the text a real daemon answers on ``/metrics`` (as Prometheus parses it),
so a name that breaks a convention fails a test wherever it comes from:

* every name has the ``controlplane_`` prefix;
* counters are exposed as ``<name>_total`` and nothing else ends in ``_total``;
* a fraction of 1 ends in ``_ratio``, a time in ``_seconds``, a size in ``_bytes``: base units
  only (no ``_milliseconds``, ``_percent``, ``_megabytes``, ...);
* ``_info`` metrics are gauges whose every sample is 1, and ``controlplane_build_info`` carries
  ``version``, ``python`` and ``triton_client``;
* no label is one Prometheus sets on the scrape (``job``, ``instance``: an exported one would be
  renamed ``exported_job``) or a reserved ``__`` name.

prometheus_client adds a ``<counter>_created`` gauge beside each counter and histogram (when its
series began); those are its convention, and pass.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.core import Metric

PREFIX = "controlplane_"
NOT_BASE_UNITS = frozenset(
    {
        "milliseconds", "microseconds", "nanoseconds", "minutes", "hours", "days", "ms", "us",
        "ns", "kilobytes", "megabytes", "gigabytes", "kb", "mb", "gb", "kib", "mib", "gib",
        "bits", "percent", "percentage", "pct",
    }
)  # fmt: skip
# A word in a name that says what unit the value has to be in.
RATIO_WORDS = frozenset({"utilization", "utilisation", "usage", "fraction", "share", "ratio"})
TIME_WORDS = frozenset({"duration", "latency", "timestamp", "age", "elapsed", "seconds"})
SIZE_WORDS = frozenset({"memory", "size", "bytes"})
SCRAPE_LABELS = frozenset({"job", "instance"})
BUILD_INFO_LABELS = frozenset({"version", "python", "triton_client"})


@dataclass(frozen=True)
class Exposed:
    """One metric as Prometheus stores it: its name, type and label names, and its samples."""

    name: str
    type: str
    labels: frozenset[str]
    values: tuple[float, ...]


def exposed(families: Iterable[Metric]) -> list[Exposed]:
    """Registry families (``counter`` named without ``_total``, ``info`` without ``_info``)
    and parsed ones (an info arrives as a gauge; ``_created`` as gauges of their own) alike."""
    found: list[Exposed] = []
    for family in families:
        kind = family.type
        name = family.name
        if kind == "counter":
            name += "_total"
        elif kind == "info":
            name += "_info"
            kind = "gauge"
        # The registry's counters and histograms carry their _created samples inside.
        inside = kind in ("counter", "histogram", "summary")
        created = [s for s in family.samples if inside and s.name.endswith("_created")]
        main = [s for s in family.samples if s not in created]
        labels = frozenset(k for s in main for k in s.labels if k not in ("le", "quantile"))
        values = tuple(s.value for s in main if s.name == name)
        found.append(Exposed(name, kind, labels, values))
        if created:
            found.append(Exposed(f"{family.name}_created", "gauge", labels, ()))
    return found


def problems(families: Iterable[Metric]) -> list[str]:
    """What breaks a convention, one line each; empty when nothing does."""
    metrics = exposed(families)
    counters = {m.name.removesuffix("_total") for m in metrics if m.type == "counter"}
    histograms = {m.name for m in metrics if m.type in ("histogram", "summary")}
    found: list[str] = []
    for metric in metrics:
        found += [f"{metric.name}: {problem}" for problem in _problems(metric)]
        if metric.name.endswith("_created") and metric.type == "gauge":
            base = metric.name.removesuffix("_created")
            if base not in counters and base not in histograms:
                found.append(f"{metric.name}: a gauge named _created with no counter {base}")
    return found


def _problems(metric: Exposed) -> Iterable[str]:
    name = metric.name
    if not name.startswith(PREFIX):
        yield f"no {PREFIX} prefix"
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        yield "not snake_case"
    if metric.type == "counter" and name.endswith("_total_total"):
        yield "a counter named with its own _total"
    if metric.type != "counter" and name.endswith("_total"):
        yield f"a {metric.type} ending in _total (only counters do)"
    base = name.removesuffix("_total") if metric.type == "counter" else name
    if name.endswith("_created") and metric.type == "gauge":
        return  # prometheus_client's companion of a counter or histogram (checked above)
    words = set(base.removeprefix(PREFIX).split("_"))
    if words & NOT_BASE_UNITS:
        yield f"not in base units ({sorted(words & NOT_BASE_UNITS)}): use _seconds, _bytes, _ratio"
    if words & RATIO_WORDS and not base.endswith("_ratio"):
        yield "a ratio not ending in _ratio"
    if base.endswith("_ratio") and any(not (0 <= v <= 1 or math.isnan(v)) for v in metric.values):
        yield f"a ratio outside [0, 1]: {metric.values}"
    if words & TIME_WORDS and not base.endswith("_seconds"):
        yield "a time not ending in _seconds"
    if words & SIZE_WORDS and not base.endswith("_bytes"):
        yield "a size not ending in _bytes"
    if name.endswith("_info"):
        if metric.type != "gauge":
            yield f"an _info metric of type {metric.type} (must be a gauge of 1)"
        if any(v != 1 for v in metric.values):
            yield f"an _info metric with values other than 1: {metric.values}"
    if name == f"{PREFIX}build_info" and metric.labels != BUILD_INFO_LABELS:
        yield f"labels {sorted(metric.labels)}, not {sorted(BUILD_INFO_LABELS)}"
    if metric.labels & SCRAPE_LABELS:
        yield f"a label Prometheus sets on the scrape: {sorted(metric.labels & SCRAPE_LABELS)}"
    if any(label.startswith("__") for label in metric.labels):
        yield "a reserved __ label"
