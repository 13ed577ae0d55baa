"""What ``/healthz`` says of the daemon's parts: each background job (running, or waiting to
be restarted, and why) and the store's event notifications."""

from __future__ import annotations

from typing import Any

from controlplane.api.schemas.timestamps import iso
from controlplane.domain.notifications import NotificationHealth
from controlplane.services.supervisor import JobStatus


def job_json(status: JobStatus) -> dict[str, Any]:
    return {
        "name": status.name,
        "state": status.state.value,
        "restarts": status.restarts,
        "last_error": status.last_error,
        "since": iso(status.since),
        "restart_at": iso(status.restart_at),
    }


def notifications_json(health: NotificationHealth) -> dict[str, Any]:
    """The store's event notifications (an SQS queue), as /healthz shows them."""
    return {
        "queue": health.source,
        "state": health.state.value,
        "since": iso(health.since),
        "problem": health.problem,
        "retry_at": iso(health.retry_at),
    }
