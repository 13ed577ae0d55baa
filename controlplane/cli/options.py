"""The options the client commands share, declared once so each reads and completes alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer

from controlplane.cli.output import Format
from controlplane.domain.errors import InvalidName
from controlplane.domain.names import validate_model_name, validate_release_name

DEFAULT_URL = "http://127.0.0.1:8080"


def _api_url(value: str) -> str:
    """An address the client can call: http(s)://host[:port][/prefix]. Anything else is bad
    usage (exit 2), not a daemon that cannot be reached."""
    scheme, sep, rest = value.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest.split("/", 1)[0]:
        raise typer.BadParameter(
            f"{value!r} is not an address of the API: give http://HOST:PORT "
            "(e.g. http://127.0.0.1:8080), or set CONTROLPLANE_URL"
        )
    return value


def model_name(value: str | None) -> str | None:
    """A model name checked by the daemon's own rule before it goes into a path: the HTTP
    client resolves '..' and '/' in a path, so 'x/../m' would act on model m."""
    return None if value is None else _named(validate_model_name, value)


def _release_name(value: str) -> str:
    return _named(validate_release_name, value)


def _named(validate: Callable[[object], str], value: str) -> str:
    try:
        return validate(value)
    except InvalidName as exc:
        raise typer.BadParameter(str(exc)) from exc


ModelArgument = Annotated[
    str, typer.Argument(metavar="MODEL", help="The model's name.", callback=model_name)
]
ReleaseArgument = Annotated[
    str, typer.Argument(metavar="RELEASE", help="The release's name.", callback=_release_name)
]
ModelFilterOption = Annotated[
    str | None, typer.Option("--model", help="Only this model's.", callback=model_name)
]

UrlOption = Annotated[
    str,
    typer.Option(
        "--url",
        envvar="CONTROLPLANE_URL",
        help="The daemon's API.",
        show_default=True,
        callback=_api_url,
    ),
]


def _daemon_url(value: str | None) -> str | None:
    return None if value is None else _api_url(value)


# No envvar: CONTROLPLANE_URL is set in shells that run the client commands, and there it must
# not turn `config --effective` (this environment's settings) into the daemon's.
DaemonUrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        help='With --effective: the running daemon\'s API (e.g. --url "$CONTROLPLANE_URL"); '
        "print its settings (GET /v1/config) rather than those this environment gives.",
        show_default=False,
        callback=_daemon_url,
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="CONTROLPLANE_TOKEN",
        help="Bearer token: the write token (api.token), or the read token (api.read_token) "
        "for commands that only read.",
        show_default=False,
    ),
]
OutputOption = Annotated[
    Format,
    typer.Option(
        "--output",
        "-o",
        case_sensitive=False,
        help="table for people; json or yaml: one document on stdout (the API's data, with "
        "'error' on a non-zero exit), messages on stderr.",
    ),
]
WaitOption = Annotated[
    bool,
    typer.Option(
        "--wait/--no-wait",
        help="Wait for the operation to end, printing each step as it ends, and exit with its "
        "outcome. Without it, print how to follow the operation and exit 0.",
    ),
]
TimeoutOption = Annotated[
    float,
    typer.Option(
        "--timeout",
        min=0,
        help="Seconds to wait before giving up (exit 4; the operation goes on).",
    ),
]
FleetOption = Annotated[
    bool,
    typer.Option(
        "--fleet",
        help="With --wait: also wait until every live member of the fleet serves it (or one "
        "cannot), and print each member's state.",
    ),
]
ReasonOption = Annotated[
    str | None,
    typer.Option(
        "--reason",
        help="Why (a ticket, the pipeline's address): recorded on the operation, shown by "
        "'controlplane history'.",
        show_default=False,
    ),
]
