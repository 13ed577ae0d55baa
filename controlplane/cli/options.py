"""The options the client commands share, declared once so each reads and completes alike."""

from __future__ import annotations

from typing import Annotated

import typer

from controlplane.cli.output import Format

DEFAULT_URL = "http://127.0.0.1:8080"

UrlOption = Annotated[
    str,
    typer.Option("--url", envvar="CONTROLPLANE_URL", help="The daemon's API.", show_default=True),
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
