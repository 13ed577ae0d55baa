"""Log output: one JSON object per line, with the operation id when there is one.

The id comes from the record (``extra``) or, for any line written while an operation's task
runs, from :data:`~controlplane.services.tracker.current_operation`, so lines from the Triton
driver or the store carry it too. Secrets never reach a log line: settings hold the token as a
``SecretStr`` and no code path formats request headers.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from controlplane.services.tracker import current_operation

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's ANSI-coloured copy of the message
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        operation_id = current_operation.get()
        if operation_id is not None:
            entry["operation_id"] = operation_id
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # One line per HTTP request would bury the log: the watcher scrapes every second.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
