"""``controlplane apply -f FILE`` and ``controlplane diff -f FILE``: the desired state from git.

The file (models_file.py) lists the release each model should serve. ``diff`` compares it with
the fleet's desired state as the daemon reads it from the store now (a daemon outside a fleet:
what it serves) and exits 1 when they differ, as ``kubectl diff`` does. ``apply`` deploys each
model whose release differs, one after the other in the file's order and through the same path
as ``controlplane deploy`` (the member called first, then the fleet), and leaves every other
model untouched, so a second apply of the same file does nothing. The first deploy that fails
or is refused stops it (exit 1): the models before it are applied, those after it are not, and
the document says which. ``--dry-run`` prints what would be deployed and changes nothing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer

from controlplane.cli.client import ApiError, Client, Unreachable, api_path
from controlplane.cli.models_file import ModelsFileError, WantedRelease, read_models_file
from controlplane.cli.operations import Start, refuse_fleet_without_wait
from controlplane.cli.options import (
    DEFAULT_URL,
    FleetOption,
    OutputOption,
    ReasonOption,
    TimeoutOption,
    TokenOption,
    UrlOption,
    WaitOption,
)
from controlplane.cli.output import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Format,
    Out,
    columns,
)

T = TypeVar("T")

FileOption = Annotated[
    str,
    typer.Option(
        "--filename",
        "-f",
        metavar="FILE",
        help="The file of releases ('models:' mapping model names to releases); - reads "
        "standard input.",
        show_default=False,
    ),
]


@dataclass(frozen=True)
class Change:
    """One model of the file against what the fleet wants now."""

    model: str
    current: str | None  # the fleet's desired release now (None: none, or unloaded)
    wanted: str

    @property
    def changed(self) -> bool:
        return self.current != self.wanted

    def json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "current": self.current,
            "wanted": self.wanted,
            "changed": self.changed,
        }


def diff(
    filename: FileOption,
    output: OutputOption = Format.TABLE,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Compare FILE's releases with the fleet's desired state: exit 0 when they agree, 1 when
    a model would change (each is listed), 2 on a bad file, 3 when the daemon is unreachable."""
    out = Out(output)
    changes = plan(out, Client(url, token), _read(out, filename))
    out.show({"models": [c.json() for c in changes]}, plan_lines(changes))
    raise typer.Exit(EXIT_FAILED if any(c.changed for c in changes) else EXIT_OK)


def apply(
    filename: FileOption,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print what would be deployed; change nothing."),
    ] = False,
    wait: WaitOption = False,
    timeout: TimeoutOption = 900.0,
    fleet: FleetOption = False,
    reason: ReasonOption = None,
    output: OutputOption = Format.TABLE,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Deploy each model of FILE whose release differs from the fleet's desired state, one
    after the other, as 'controlplane deploy' does; models unchanged or not listed are left
    alone. --timeout is for the whole file."""
    out = Out(output)
    refuse_fleet_without_wait(out, fleet=fleet, wait=wait)
    deadline = time.monotonic() + timeout
    client = Client(url, token)
    changes = plan(out, client, _read(out, filename))
    for line in plan_lines(changes):
        out.say(line)
    results = [c.json() for c in changes]
    if dry_run:
        out.say("dry run: nothing was deployed")
        out.document({"dry_run": True, "models": results})
        return
    why = reason if reason is not None else f"controlplane apply -f {filename}"
    for change, result in zip(changes, results, strict=True):
        if not change.changed:
            continue
        nested = Nested(output)
        left = max(0.0, deadline - time.monotonic())
        start = Start(nested, client, wait, left, fleet, why)
        try:
            start.run(api_path("v1", "models", change.model, "deploy"), {"release": change.wanted})
        except Stopped as stop:
            result.update(stop.body)
            result["error"] = {"code": stop.code, "message": stop.message}
            raise out.fail(
                stop.exit_code,
                stop.code,
                f"{change.model} {change.wanted}: {stop.message} (models before it in the file "
                "were applied, those after it were not)",
                {"models": results},
            ) from None
        result.update(nested.documents[-1] if nested.documents else {})
    if not any(c.changed for c in changes):
        out.say("nothing to apply: every model listed has its release already")
    out.document({"dry_run": False, "models": results})


def _read(out: Out, filename: str) -> list[WantedRelease]:
    try:
        if filename == "-":
            return read_models_file(None, sys.stdin.read())
        return read_models_file(Path(filename))
    except ModelsFileError as exc:
        raise out.fail(EXIT_USAGE, "invalid_file", str(exc)) from None


def plan(out: Out, client: Client, wanted: list[WantedRelease]) -> list[Change]:
    """Each model of the file against the fleet's desired release now, read from the store
    by the daemon; a daemon outside a fleet: the release it serves."""
    try:
        fleet = client.get("/v1/fleet")
    except ApiError as exc:
        if exc.code != "invalid_request":  # not a fleet's member: compare with what it serves
            raise out.fail(EXIT_FAILED, exc.code, exc.message) from None
        return [Change(w.model, _serving(out, client, w.model), w.release) for w in wanted]
    except Unreachable as exc:
        raise out.fail(EXIT_UNREACHABLE, "unreachable", str(exc)) from None
    if fleet.get("store_error"):
        out.warn(
            f"warning: the store cannot be read now ({fleet['store_error']}): compared with "
            "the fleet's desired state as last read"
        )
    models: dict[str, Any] = fleet.get("models") or {}
    return [Change(w.model, (models.get(w.model) or {}).get("desired"), w.release) for w in wanted]


def _serving(out: Out, client: Client, model: str) -> str | None:
    try:
        found: str | None = client.get(api_path("v1", "models", model)).get("active_release")
    except ApiError as exc:
        if exc.code == "model_not_found":
            return None
        raise out.fail(EXIT_FAILED, exc.code, exc.message) from None
    except Unreachable as exc:
        raise out.fail(EXIT_UNREACHABLE, "unreachable", str(exc)) from None
    return found


def plan_lines(changes: list[Change]) -> list[str]:
    rows = [
        (c.model, c.current or "-", c.wanted, "deploy" if c.changed else "unchanged")
        for c in changes
    ]
    return columns(("MODEL", "NOW", "FILE", "ACTION"), rows)


# --- one deploy of several -----------------------------------------------------------------


class Stopped(Exception):
    """One deploy of the file failed, was refused or ran out of time."""

    def __init__(self, exit_code: int, code: str, message: str, body: dict[str, Any]) -> None:
        super().__init__(f"{code}: {message}")
        self.exit_code, self.code, self.message, self.body = exit_code, code, message, body


@dataclass(frozen=True)
class Nested(Out):
    """The output of one deploy inside ``apply``: its lines as a deploy prints them, its
    document kept for apply's own (stdout carries one document for the whole file), and its
    failure raised as :class:`Stopped` for apply to report."""

    documents: list[dict[str, Any]] = field(default_factory=list)

    def document(self, data: Any) -> None:
        self.documents.append(dict(data))

    def fail(
        self, exit_code: int, code: str, message: str, body: Mapping[str, Any] | None = None
    ) -> NoReturn:
        raise Stopped(exit_code, code, message, dict(body or {}))

    def call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except ApiError as exc:
            extra = {key: value for key, value in exc.body.items() if key != "error"}
            raise Stopped(EXIT_FAILED, exc.code, exc.message, extra) from None
        except Unreachable as exc:
            raise Stopped(EXIT_UNREACHABLE, "unreachable", str(exc), {}) from None
