"""Alerts received from Alertmanager, as the daemon keeps them.

Alertmanager resends a firing alert every ``repeat_interval`` and sends it again when it
resolves; one alert is one ``(fingerprint, startsAt)``. Only the first firing receipt of an
alert acts; later receipts are counted and ``resolved`` is recorded (never re-promotes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum


class AlertStatus(StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


class Receipt(StrEnum):
    NEW = "new"  # first receipt of a firing alert: act on it
    DUPLICATE = "duplicate"  # seen before in this state: nothing to do
    RESOLVED = "resolved"  # recorded; resolution never re-promotes


@dataclass(frozen=True)
class Alert:
    fingerprint: str
    starts_at: datetime
    status: AlertStatus
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    def describe(self) -> str:
        summary = self.annotations.get("summary") or self.annotations.get("description")
        name = self.name or "alert"
        return f"{name}: {summary}" if summary else name


@dataclass(frozen=True)
class AlertRecord:
    """One alert as stored: what it said last, and how often Alertmanager sent it."""

    alert: Alert
    first_received: datetime
    last_received: datetime
    receipts: int
