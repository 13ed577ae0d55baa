"""``controlplane rollout pause|resume|promote|abort MODEL``: a person's hand on a fleet rollout.

Each posts ``/v1/models/MODEL/rollout/<control>`` and shows the model across the fleet as the
daemon answers it (``-o json``: that answer; a refusal exits 1 with the API's error, e.g.
``no_rollout_in_progress``).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from controlplane.cli.client import Client, api_path
from controlplane.cli.fleet import paused_text, rolling_text
from controlplane.cli.options import (
    DEFAULT_URL,
    ModelArgument,
    OutputOption,
    TokenOption,
    UrlOption,
)
from controlplane.cli.output import Format, Out

app = typer.Typer(
    help="Pause, resume, promote or abort a model's rollout across the fleet.",
    no_args_is_help=True,
)

ReasonOption = Annotated[
    str | None,
    typer.Option(
        "--reason",
        help="Why (a ticket, a dashboard): recorded in the fleet's desired state and shown by "
        "'controlplane fleet' and 'status'.",
        show_default=False,
    ),
]


def _control(
    control: str, model: str, reason: str | None, output: Format, url: str, token: str | None
) -> None:
    out = Out(output)
    body: dict[str, Any] = {"reason": reason} if reason else {}
    client = Client(url, token)
    data = out.call(lambda: client.post(api_path("v1", "models", model, "rollout", control), body))
    out.show(data, model_lines(data))


def model_lines(data: dict[str, Any]) -> list[str]:
    """One model across the fleet, as a person reads it."""
    lines = [
        f"{data.get('model')}: desired {data.get('desired') or '(unloaded)'} (generation "
        f"{data.get('generation')}), phase {data.get('phase')}"
        + (f", stable {data['stable']}" if data.get("stable") else "")
        + (f", canaries {', '.join(data['canaries'])}" if data.get("canaries") else "")
    ]
    if data.get("paused"):
        lines.append(f"  {paused_text(data['paused'])}")
    if data.get("rollout_note"):
        lines.append(f"  {data['rollout_note']}")
    if data.get("reason"):
        lines.append(f"  {data['reason']}")
    for member in data.get("members", []):
        mark = "" if member.get("alive") else " (not alive)"
        rolling = rolling_text(member)
        lines.append(
            f"  member {member.get('member')}{mark}: {member.get('release') or '-'} "
            f"({member.get('state') or 'no report'})" + (f" [{rolling}]" if rolling else "")
        )
    return lines


@app.command()
def pause(
    model: ModelArgument,
    reason: ReasonOption = None,
    output: OutputOption = Format.TABLE,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Hold MODEL's rollout where it stands: no member starts towards a release it does not
    serve yet, none takes a rolling turn, and a bake's clock stops."""
    _control("pause", model, reason, output, url, token)


@app.command()
def resume(
    model: ModelArgument,
    reason: ReasonOption = None,
    output: OutputOption = Format.TABLE,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Let MODEL's paused rollout go on where it stood."""
    _control("resume", model, reason, output, url, token)


@app.command()
def promote(
    model: ModelArgument,
    reason: ReasonOption = None,
    output: OutputOption = Format.TABLE,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """End MODEL's canary rollout now: every member follows the release."""
    _control("promote", model, reason, output, url, token)


@app.command()
def abort(
    model: ModelArgument,
    reason: ReasonOption = None,
    output: OutputOption = Format.TABLE,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Stop MODEL's canary rollout: every member that moved goes back to the stable release
    (not latched degraded: it can be deployed again)."""
    _control("abort", model, reason, output, url, token)
