"""Log lines as operators read them: JSON, one per line, the operation id on every line of an
operation, whichever module wrote it."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.cli.logs import JsonFormatter, configure
from tests.support.fakes import LoadFails
from tests.support.service_views import publish
from tests.unit.test_bluegreen_service import MODEL, bg_service, deploy_and_wait


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())
        self.lines: list[dict[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("controlplane")
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


def test_every_line_of_an_operation_carries_its_id(tmp_path: Path, lines: Lines) -> None:
    async def scenario() -> str:
        async with bg_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            await deploy_and_wait(service, "r1")
            lines.lines.clear()
            # The alias's re-point fails: the blue-green module logs it, with no extra of its own.
            parts.triton.script_load(MODEL, LoadFails("ensemble refused"))
            op = await deploy_and_wait(service, "r2")
            return op.id

    operation_id = asyncio.run(scenario())

    assert any("pointing it back" in str(line["message"]) for line in lines.lines)
    assert lines.lines
    for line in lines.lines:
        assert line["operation_id"] == operation_id, line
        assert set(line) >= {"time", "level", "logger", "message"}


def test_http_client_requests_are_not_logged_one_line_each() -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    clients = [logging.getLogger(name) for name in ("httpx", "httpcore")]
    client_levels = [logger.level for logger in clients]
    try:
        configure("INFO")
        assert logging.getLogger("controlplane").isEnabledFor(logging.INFO)
        assert not any(logger.isEnabledFor(logging.INFO) for logger in clients)
        assert all(logger.isEnabledFor(logging.WARNING) for logger in clients)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        for logger, level in zip(clients, client_levels, strict=True):
            logger.setLevel(level)
