"""How a client command prints: a table for people, or one JSON or YAML document for scripts.

With ``-o json`` or ``-o yaml`` stdout carries exactly one document, whatever happens: the API's
data on success, and on any non-zero exit an object with ``error`` (``code``, ``message``) beside
what the API said (the failed operation, the fleet), so that a script can always parse it.
Progress lines and messages then go to stderr. With the default ``table``, they go to stdout and
errors to stderr, as a person reads them.

The exit codes live here, the one place that decides them (main.py's docstring lists them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

import typer
import yaml

from controlplane.cli.client import ApiError, Unreachable

T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILED = 1  # the operation failed or was refused
EXIT_USAGE = 2  # bad usage (typer's own code for it)
EXIT_UNREACHABLE = 3  # the daemon could not be reached
EXIT_GAVE_UP = 4  # --timeout ran out while waiting; what was waited for goes on


class Format(StrEnum):
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


def render(data: Any, fmt: Format, *, compact: bool = False) -> str:
    """``data`` as one document; ``compact`` JSON is one line (for a stream of documents)."""
    if fmt is Format.YAML:
        text: str = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        return text.rstrip("\n")
    return json.dumps(data, indent=None if compact else 2, ensure_ascii=False)


def columns(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Left-aligned columns as wide as their widest cell; the last one is not padded."""
    table = [list(header), *(list(row) for row in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    return [
        "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]])
        for row in table
    ]


@dataclass(frozen=True)
class Out:
    """One command's output, in the format it was asked for."""

    format: Format = Format.TABLE

    @property
    def machine(self) -> bool:
        return self.format is not Format.TABLE

    def say(self, line: str) -> None:
        """A line for a person: stdout with a table, stderr when stdout is a document."""
        typer.echo(line, err=self.machine)

    def warn(self, line: str) -> None:
        typer.echo(line, err=True)

    def show(self, data: Any, lines: Iterable[str]) -> None:
        """The result: ``data`` as the document, or ``lines`` as the table."""
        if self.machine:
            typer.echo(render(data, self.format))
        else:
            for line in lines:
                typer.echo(line)

    def document(self, data: Any) -> None:
        """``data`` as the document; nothing with a table (the lines were said already)."""
        if self.machine:
            typer.echo(render(data, self.format))

    def fail(
        self, exit_code: int, code: str, message: str, body: Mapping[str, Any] | None = None
    ) -> typer.Exit:
        """Say the error (with ``body`` beside it: as the document, or on stderr); the exit to
        raise. ``body`` is a mapping, never keywords: an API answer carries keys of any name
        (an ``unchanged`` deploy's ``message``), and none of them may clash with these
        parameters or replace the ``error`` said here."""
        if self.machine:
            extra = {key: value for key, value in (body or {}).items() if key != "error"}
            document = {"error": {"code": code, "message": message}, **extra}
            typer.echo(render(document, self.format))
        else:
            typer.echo(f"error: {code}: {message}", err=True)
        return typer.Exit(exit_code)

    def call(self, fn: Callable[[], T]) -> T:
        """``fn``'s answer; an error answer exits 1 (with the API's error body as the
        document), an unreachable daemon exits 3."""
        try:
            return fn()
        except ApiError as exc:
            if self.machine and "error" in exc.body:
                typer.echo(render(exc.body, self.format))
                raise typer.Exit(EXIT_FAILED) from None
            raise self.fail(EXIT_FAILED, exc.code, exc.message) from None
        except Unreachable as exc:
            raise self.fail(EXIT_UNREACHABLE, "unreachable", str(exc)) from None
