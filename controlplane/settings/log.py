"""The daemon's logs: their level, and JSON for collectors or one short line for people."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from controlplane.settings.group import Group


class LogSettings(Group):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level.")
    format: Literal["auto", "json", "text"] = Field(
        "auto",
        description="json: one JSON object per line (for log collectors); text: one short "
        "line (time, level, message, operation id) for people; auto: text when stderr is a "
        "terminal, json otherwise.",
    )
