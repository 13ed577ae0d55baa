"""A live view (``status --watch``): look again every interval until Ctrl-C.

On a terminal the screen is cleared and the view redrawn at every look, with the time of the
look, as ``watch(1)`` does. When stdout is not a terminal (a pipe, a file, a test) a view is
printed only when it differs from the one before, so the output is the history of the changes:
a table block under a ``--- <time>`` line, or one document per change (JSON: one line each;
YAML: a ``---`` stream). What counts as a change is what the table shows, in every format, so
timestamps that move at each read (``as_of``, the overload samples) do not make a new document.

A daemon that cannot be reached, or an error answer, is shown as the view and looked at again:
the view outlives a daemon restart. Ctrl-C ends it with exit code 0, as a broken pipe does;
a reader that went away (``--watch | head -3``) ends it at the next look, even when nothing
changed since, rather than at the next change that writes.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn

import typer

from controlplane.cli.client import ApiError, Unreachable
from controlplane.cli.output import EXIT_OK, Format, Out, render

CLEAR = "\x1b[H\x1b[2J"  # cursor home, erase the screen


@dataclass(frozen=True)
class Look:
    """One look: the API's data (the document), the table, and problems of the daemon."""

    data: dict[str, Any]
    lines: Sequence[str]
    problems: Sequence[str] = ()


def watch(out: Out, look: Callable[[], Look], interval: float, title: str) -> NoReturn:
    terminal = sys.stdout.isatty()
    shown: str | None = None
    signal.signal(signal.SIGINT, _first_interrupt_only)
    try:
        while True:
            seen = _safely(look)
            view = "\n".join([*seen.lines, *seen.problems])
            if terminal:
                typer.echo(CLEAR + _screen(out, seen, title, interval), nl=False)
            elif view != shown:
                typer.echo(_block(out, seen))
            elif _reader_gone():
                raise BrokenPipeError
            shown = view
            time.sleep(interval)
    except KeyboardInterrupt:
        raise typer.Exit(EXIT_OK) from None
    except BrokenPipeError:  # `... --watch | head`: the reader has seen enough
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the flush at exit does not fail again
        raise typer.Exit(EXIT_OK) from None


def _first_interrupt_only(_signum: int, _frame: object) -> None:
    """Ctrl-C ends the watch with exit 0; a second SIGINT while it ends (a key held down, or
    `timeout -s INT`, which signals the command and then its whole process group) is ignored,
    or it would interrupt the exit itself and the command would end 130."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def _reader_gone() -> bool:
    """Whether stdout is a pipe whose reader closed it: Linux reports POLLERR on the writing
    end then, with nothing written."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLERR)
        return any(events & select.POLLERR for _fd, events in poller.poll(0))
    except (OSError, ValueError):  # not a real file (a test's capture): nothing to tell
        return False


def _safely(look: Callable[[], Look]) -> Look:
    try:
        return look()
    except ApiError as exc:
        return _error(exc.code, exc.message)
    except Unreachable as exc:
        return _error("unreachable", str(exc))


def _error(code: str, message: str) -> Look:
    return Look({"error": {"code": code, "message": message}}, [f"error: {code}: {message}"])


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _screen(out: Out, seen: Look, title: str, interval: float) -> str:
    header = f"Every {interval:g} s: {title}    {_now()}    (Ctrl-C to stop)"
    body = render(seen.data, out.format) if out.machine else "\n".join(seen.lines)
    return "\n".join([header, "", body, *seen.problems]) + "\n"


def _block(out: Out, seen: Look) -> str:
    if out.format is Format.JSON:
        return render(seen.data, Format.JSON, compact=True)
    if out.format is Format.YAML:
        return "---\n" + render(seen.data, Format.YAML)
    return "\n".join([f"--- {_now()}", *seen.lines, *seen.problems])
