"""How a moment is written in every answer: ISO 8601 with its offset, or null."""

from __future__ import annotations

from datetime import datetime


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
