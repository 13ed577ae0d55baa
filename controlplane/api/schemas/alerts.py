"""An alert in and out: Alertmanager's webhook body (version 4), and an alert as received.

The webhook's models ignore the fields this daemon does not use (Alertmanager sends more than
it needs, and a newer Alertmanager may send more still), but are strict about those it does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from controlplane.api.schemas.requests import Text
from controlplane.api.schemas.timestamps import iso
from controlplane.domain.alerts import Alert, AlertRecord, AlertStatus


class AlertmanagerAlert(BaseModel):
    """One alert of Alertmanager's webhook (version 4); fields not used here are ignored."""

    model_config = ConfigDict(extra="ignore")
    status: Literal["firing", "resolved"]
    labels: dict[Text, Text] = Field(max_length=64)
    annotations: dict[Text, Text] = Field(default_factory=dict, max_length=64)
    startsAt: AwareDatetime  # noqa: N815 (Alertmanager's field name)
    fingerprint: str = Field(pattern=r"^[A-Za-z0-9]{1,64}$")

    @field_validator("startsAt", mode="before")
    @classmethod
    def _rfc3339_text(cls, value: object) -> object:
        # Lax datetime parsing would take a number as seconds since 1970: the document says a
        # date-time string, and a number is a broken sender, not an alert from 1970.
        if not isinstance(value, str):
            raise ValueError("startsAt must be an RFC 3339 date-time string")
        return value

    def to_domain(self) -> Alert:
        return Alert(
            fingerprint=self.fingerprint,
            starts_at=self.startsAt,
            status=AlertStatus(self.status),
            labels=self.labels,
            annotations=self.annotations,
        )


class AlertmanagerNotification(BaseModel):
    """Alertmanager's webhook body, version 4."""

    model_config = ConfigDict(extra="ignore")
    version: str = Field(json_schema_extra={"enum": ["4"]})  # refused below with a reason
    status: Literal["firing", "resolved"]
    receiver: Text = ""
    alerts: list[AlertmanagerAlert] = Field(min_length=1, max_length=1000)

    @field_validator("version")
    @classmethod
    def _version_4(cls, version: str) -> str:
        if version != "4":
            raise ValueError(f"Alertmanager webhook version {version!r}; only '4' is understood")
        return version


def alert_json(record: AlertRecord) -> dict[str, Any]:
    alert = record.alert
    return {
        "fingerprint": alert.fingerprint,
        "starts_at": iso(alert.starts_at),
        "status": alert.status.value,
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "first_received": iso(record.first_received),
        "last_received": iso(record.last_received),
        "receipts": record.receipts,
    }
