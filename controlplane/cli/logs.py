"""Log output: JSON lines for collectors, or one short line each for a person at a terminal.

``log.format`` decides: ``json`` (one object per line), ``text`` (time, level, message, the
extra fields as ``key=value``, the operation id), or ``auto``, which writes text when stderr is
a terminal (``make run``, a daemon started by hand) and JSON otherwise (a container's log, a
file, a pipe). Both carry the same facts. The operation id comes from the record (``extra``)
or, for any line written while an operation's task runs, from
:data:`~controlplane.services.tracker.current_operation`, so lines from the Triton driver or
the store carry it too. Secrets never reach a log line: settings hold the tokens as
``SecretStr`` and no code path formats request headers.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

from controlplane.services.tracker import current_operation

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's ANSI-coloured copy of the message
}
_LEVELS = {"WARNING": "WARN", "CRITICAL": "CRIT"}


def _extras(record: logging.LogRecord) -> dict[str, object]:
    return {
        key: value
        for key, value in vars(record).items()
        if key not in _STANDARD and not key.startswith("_")
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
        entry.update(_extras(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """``12:04:05.123 WARN  message  key=value op=<id>``, in local time."""

    def format(self, record: logging.LogRecord) -> str:
        at = datetime.fromtimestamp(record.created).strftime("%H:%M:%S.%f")[:-3]
        level = _LEVELS.get(record.levelname, record.levelname)
        line = f"{at} {level:<5} {record.getMessage()}"
        extras = _extras(record)
        operation_id = extras.pop("operation_id", None) or current_operation.get()
        fields = [f"{key}={_short(value)}" for key, value in extras.items()]
        if operation_id is not None:
            fields.append(f"op={operation_id}")
        if fields:
            line += "  " + " ".join(fields)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _short(value: object) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    text = str(value)
    return json.dumps(text) if not text or any(c.isspace() for c in text) else text


def formatter_for(log_format: str, stream: TextIO) -> logging.Formatter:
    """The formatter ``log.format`` names; ``auto``: text on a terminal, JSON otherwise."""
    if log_format == "text" or (log_format == "auto" and _is_terminal(stream)):
        return TextFormatter()
    return JsonFormatter()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a file
        return False


def configure(level: str, log_format: str = "auto") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter_for(log_format, sys.stderr))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # One line per HTTP request would bury the log: the watcher scrapes every second.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
