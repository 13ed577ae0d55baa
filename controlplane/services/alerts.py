"""Alerts from Alertmanager: stored first, deduped, and turned into at most one rollback each.

Every alert in a notification is stored (and its receipt counted) before the webhook answers,
so an answer of 2xx means nothing is lost. The first firing receipt of an alert, one
``(fingerprint, startsAt)``, starts a rollback in the background: of the model its label names,
or of every model with a fallback when it names none. Repeats are counted and do nothing;
``resolved`` is recorded and never re-promotes anything.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from controlplane.domain.alerts import Alert, AlertRecord, Receipt
from controlplane.domain.errors import InvalidName
from controlplane.domain.names import validate_model_name
from controlplane.domain.operations import Trigger
from controlplane.ports import AlertBook, Clock, Telemetry
from controlplane.services.rollback import AutoRollback
from controlplane.services.tasks import TaskOwner
from controlplane.services.telemetry import NO_TELEMETRY

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AlertAnswer:
    fingerprint: str
    status: str
    receipt: Receipt
    action: str


class AlertReceiver:
    def __init__(
        self,
        *,
        book: AlertBook,
        rollback: AutoRollback,
        clock: Clock,
        tasks: TaskOwner,
        model_label: str,
        telemetry: Telemetry = NO_TELEMETRY,
    ) -> None:
        self._telemetry = telemetry
        self._book = book
        self._rollback = rollback
        self._clock = clock
        self._tasks = tasks
        self._label = model_label

    async def receive(self, alerts: Sequence[Alert]) -> list[AlertAnswer]:
        return [await self._one(alert) for alert in alerts]

    async def recent(self, limit: int) -> list[AlertRecord]:
        return await self._book.recent(limit)

    async def _one(self, alert: Alert) -> AlertAnswer:
        receipt = await self._book.record(alert, self._clock.now())
        self._telemetry.alert_received(receipt)
        answer = AlertAnswer(alert.fingerprint, alert.status.value, receipt, "")
        if receipt is Receipt.RESOLVED:
            log.info("alert %s resolved; nothing is re-promoted", alert.describe())
            return _with(answer, "recorded; a resolved alert re-promotes nothing")
        if receipt is Receipt.DUPLICATE:
            return _with(answer, "already acted on this alert; counted")
        named = alert.labels.get(self._label)
        if named is not None:
            try:
                validate_model_name(named)
            except InvalidName as exc:
                log.warning("alert %s names no valid model: %s", alert.describe(), exc.message)
                return _with(answer, f"label {self._label}: {exc.message}; nothing done")
            targets: list[str] | None = [named]
            action = f"rolling back {named}"
        else:
            targets = await self._rollback.candidates()
            if not targets:
                log.warning("alert %s: no model here has a fallback", alert.describe())
                return _with(answer, "no model here has a fallback; nothing done")
            action = "rolling back " + ", ".join(targets)
        log.warning("alert %s fired: %s", alert.describe(), action)
        key = f"alert-{alert.fingerprint}-{alert.starts_at.timestamp():.0f}"
        self._tasks.spawn(
            key, self._rollback.on_overload(targets, trigger=Trigger.ALERT, reason=alert.describe())
        )
        return _with(answer, action)


def _with(answer: AlertAnswer, action: str) -> AlertAnswer:
    return AlertAnswer(answer.fingerprint, answer.status, answer.receipt, action)
