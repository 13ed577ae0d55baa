"""The commands that start an operation (``deploy``, ``rollback``, ``unload``) and ``wait``,
which follows one to its end.

An operation is always started without the API's ``wait`` and then polled, so each step is
printed as it ends and ``--timeout`` is the CLI's own. The document of ``-o json|yaml`` is the
API's: without ``--wait`` the answer to the POST (the started operation), with it the finished
operation (``{"operation": ...}``), with ``--fleet`` also the model across the fleet
(``"fleet"``), as ``"wait": true, "fleet": true`` would answer.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from controlplane.cli.client import Client, api_path
from controlplane.cli.fleet import follow_fleet
from controlplane.cli.follow import fetch, follow, say_how_to_follow
from controlplane.cli.options import (
    DEFAULT_URL,
    FleetOption,
    ModelArgument,
    OutputOption,
    ReasonOption,
    ReleaseArgument,
    TimeoutOption,
    TokenOption,
    UrlOption,
    WaitOption,
)
from controlplane.cli.output import EXIT_USAGE, Format, Out


def deploy(
    model: ModelArgument,
    release: ReleaseArgument,
    wait: WaitOption = False,
    timeout: TimeoutOption = 900.0,
    fleet: FleetOption = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Load even when the headroom check finds too little free memory."
        ),
    ] = False,
    reason: ReasonOption = None,
    output: OutputOption = Format.TABLE,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Serve RELEASE of MODEL."""
    body: dict[str, Any] = {"release": release}
    if force:
        body["force"] = True
    start = Start(Out(output), Client(url, token), wait, timeout, fleet, reason)
    start.run(api_path("v1", "models", model, "deploy"), body)


def rollback(
    model: ModelArgument,
    to: Annotated[str, typer.Option("--to", help="Release to go back to.")] = "previous",
    wait: WaitOption = False,
    timeout: TimeoutOption = 900.0,
    fleet: FleetOption = False,
    reason: ReasonOption = None,
    output: OutputOption = Format.TABLE,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Serve the previous release of MODEL again (or the one given with --to)."""
    start = Start(Out(output), Client(url, token), wait, timeout, fleet, reason)
    start.run(api_path("v1", "models", model, "rollback"), {"to": to})


def unload(
    model: ModelArgument,
    wait: WaitOption = False,
    timeout: TimeoutOption = 300.0,
    fleet: FleetOption = False,
    reason: ReasonOption = None,
    output: OutputOption = Format.TABLE,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Unload MODEL from Triton and remove it from the repository, on every member."""
    start = Start(Out(output), Client(url, token), wait, timeout, fleet, reason)
    start.run(api_path("v1", "models", model, "unload"), {})


def wait(
    operation_id: Annotated[str, typer.Argument(metavar="OPERATION", help="The operation's id.")],
    timeout: TimeoutOption = 900.0,
    output: OutputOption = Format.TABLE,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Follow OPERATION to its end, as --wait does, and exit with its outcome."""
    out, client = Out(output), Client(url, token)
    deadline = time.monotonic() + timeout
    operation = fetch(out, client, operation_id)
    out.say(_started_line(operation))
    out.document({"operation": follow(out, client, operation, deadline, timeout)})


def refuse_fleet_without_wait(out: Out, *, fleet: bool, wait: bool) -> None:
    """``--fleet`` is a wait for the fleet: alone it is bad usage, said before anything starts."""
    if fleet and not wait:
        out.warn("--fleet waits for the fleet: use it with --wait")
        raise typer.Exit(EXIT_USAGE)


class Start:
    """Start one operation and, as asked, follow it and the fleet."""

    def __init__(
        self,
        out: Out,
        client: Client,
        wait: bool,
        timeout: float,
        fleet: bool,
        reason: str | None,
    ) -> None:
        self.out, self.client = out, client
        self.wait, self.timeout, self.fleet, self.reason = wait, timeout, fleet, reason

    def run(self, path: str, body: dict[str, Any]) -> None:
        out, client = self.out, self.client
        refuse_fleet_without_wait(out, fleet=self.fleet, wait=self.wait)
        if self.fleet:  # before anything starts: a daemon that is not in a fleet cannot wait
            out.call(lambda: client.get("/v1/fleet"))
        deadline = time.monotonic() + self.timeout
        if self.reason is not None:
            body = {**body, "reason": self.reason}
        # The daemon answers once it has claimed the model, which may wait behind its own
        # retire of an old slot (minutes at most): as long as --timeout allows.
        answer = out.call(
            lambda: client.post(path, {**body, "wait": False}, timeout=max(30.0, self.timeout))
        )
        if answer.get("unchanged"):
            out.say(f"unchanged: {answer.get('message', '')}")
            if self.fleet:
                answer["fleet"] = follow_fleet(
                    out, client, answer["model"], answer["release"], deadline, self.timeout, answer
                )
            out.document(answer)
            return
        operation: dict[str, Any] = answer["operation"]
        out.say(_started_line(operation))
        if not self.wait:
            say_how_to_follow(out, client, operation["id"])
            out.document(answer)
            return
        done = {"operation": follow(out, client, operation, deadline, self.timeout)}
        if self.fleet:
            release = done["operation"].get("release")
            model = done["operation"]["model"]
            done["fleet"] = follow_fleet(out, client, model, release, deadline, self.timeout, done)
        out.document(done)


def _started_line(operation: dict[str, Any]) -> str:
    what = f"{operation['kind']} {operation['model']} {operation.get('release') or ''}".rstrip()
    return f"operation {operation['id']}: {what}"
