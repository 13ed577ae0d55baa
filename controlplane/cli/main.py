"""The ``controlplane`` command: the daemon (``serve``) and a client for CI and operators.

Exit codes: 0 success; 1 the operation failed or was refused (or, with --fleet, a member could
not follow); 2 bad usage or settings; 3 the daemon could not be reached; 4 (--fleet) the fleet
did not converge within --timeout (it goes on converging).
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from controlplane.cli.client import ApiError, Client, Unreachable
from controlplane.cli.fleet import fleet_table, follow_fleet
from controlplane.settings import settings_help

EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE = 1, 2, 3
FINISHED = ("succeeded", "failed", "interrupted")

app = typer.Typer(
    help="controlplane: safe, fast model updates for NVIDIA Triton Inference Server.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

UrlOption = Annotated[
    str,
    typer.Option("--url", envvar="CONTROLPLANE_URL", help="The daemon's API.", show_default=True),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token", envvar="CONTROLPLANE_TOKEN", help="Bearer token (api.token).", show_default=False
    ),
]
WaitOption = Annotated[
    bool, typer.Option("--wait", help="Wait for the operation; print each step as it ends.")
]
TimeoutOption = Annotated[
    float, typer.Option("--timeout", help="Seconds to wait with --wait before giving up.")
]
FleetOption = Annotated[
    bool,
    typer.Option(
        "--fleet",
        help="With --wait: also wait until every live member of the fleet serves it (or one "
        "cannot), and print each member's state.",
    ),
]
DEFAULT_URL = "http://127.0.0.1:8080"


@app.command(epilog=settings_help())
def serve(
    config: Annotated[
        Path | None, typer.Option("--config", help="YAML settings file (env vars override it).")
    ] = None,
) -> None:
    """Run the daemon: the REST API, start-up reconcile and every background task."""
    from controlplane.cli.serve import run  # the daemon's imports are heavy: load on demand

    raise typer.Exit(run(config))


@app.command()
def config(
    defaults: Annotated[bool, typer.Option("--defaults", help="Print every default.")] = False,
) -> None:
    """Print the settings file with every setting, its default and what it does."""
    from controlplane.settings import render_defaults

    if not defaults:
        typer.echo("use --defaults to print the default settings file", err=True)
        raise typer.Exit(EXIT_USAGE)
    typer.echo(render_defaults(), nl=False)


@app.command()
def deploy(
    model: str,
    release: str,
    wait: WaitOption = False,
    timeout: TimeoutOption = 900.0,
    fleet: FleetOption = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Load even when the headroom check finds too little free memory."
        ),
    ] = False,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Serve RELEASE of MODEL."""
    client = Client(url, token)
    body: dict[str, Any] = {"release": release}
    if force:
        body["force"] = True
    _operation(client, f"/v1/models/{model}/deploy", body, wait, timeout, fleet)


@app.command()
def rollback(
    model: str,
    to: Annotated[str, typer.Option("--to", help="Release to go back to.")] = "previous",
    wait: WaitOption = False,
    timeout: TimeoutOption = 900.0,
    fleet: FleetOption = False,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Serve the previous release of MODEL again (or the one given with --to)."""
    client = Client(url, token)
    _operation(client, f"/v1/models/{model}/rollback", {"to": to}, wait, timeout, fleet)


@app.command()
def unload(
    model: str,
    wait: WaitOption = False,
    timeout: TimeoutOption = 300.0,
    fleet: FleetOption = False,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Unload MODEL from Triton and remove it from the repository (on every member: the
    fleet's desired state says it is unloaded)."""
    _operation(Client(url, token), f"/v1/models/{model}/unload", {}, wait, timeout, fleet)


@app.command(name="fleet")
def fleet_command(url: UrlOption = DEFAULT_URL, token: TokenOption = None) -> None:
    """The fleet: each member (alive or not, what it serves) and each model's desired state."""
    data = _call(lambda: Client(url, token).get("/v1/fleet"))
    for line in fleet_table(data):
        typer.echo(line)


@app.command()
def status(
    model: Annotated[str | None, typer.Argument(help="One model; all when omitted.")] = None,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """What serves, what Triton says, and the last operation."""
    client = Client(url, token)
    data = _call(lambda: client.get(f"/v1/models/{model}" if model else "/v1/models"))
    models = [data] if model else data.get("models", [])
    if not models:
        typer.echo("no models managed here or in the store")
    for view in models:
        _print_model(view)
    health = _call(lambda: client.get("/healthz"))
    conflict = (health.get("fleet") or {}).get("name_conflict")
    if conflict and not model:  # one model's view says it under that model
        typer.echo(f"fleet: NAME CONFLICT: {conflict}", err=True)
    for job in health.get("jobs", []):
        if job["state"] != "running":
            typer.echo(
                f"job {job['name']}: {job['state']} after {job['restarts']} restart(s): "
                f"{job.get('last_error') or '-'}",
                err=True,
            )


def _operation(
    client: Client,
    path: str,
    body: dict[str, Any],
    wait: bool,
    timeout: float,
    fleet: bool = False,
) -> None:
    if fleet and not wait:
        typer.echo("--fleet waits for the fleet: use it with --wait", err=True)
        raise typer.Exit(EXIT_USAGE)
    if fleet:  # before anything starts: a daemon that is not in a fleet cannot wait for one
        _call(lambda: client.get("/v1/fleet"))
    deadline = time.monotonic() + timeout
    operation = _run_operation(client, path, body, wait, deadline, timeout)
    if fleet and operation is not None:
        code = follow_fleet(
            client, operation["model"], operation.get("release"), deadline, timeout, _call
        )
        if code:
            raise typer.Exit(code)


def _run_operation(
    client: Client,
    path: str,
    body: dict[str, Any],
    wait: bool,
    deadline: float,
    timeout: float,
) -> dict[str, Any] | None:
    """Start the operation and (``wait``) follow it to its end; the operation, or None when
    it was not waited for or nothing had to be done here."""
    data = _call(lambda: client.post(path, {**body, "wait": False}))
    if data.get("unchanged"):
        typer.echo(f"unchanged: {data.get('message', '')}")
        return {"model": data["model"], "release": data["release"]}
    operation: dict[str, Any] = data["operation"]
    typer.echo(
        f"operation {operation['id']}: {operation['kind']} {operation['model']} "
        f"{operation.get('release') or ''}".rstrip()
    )
    if not wait:
        typer.echo(f"follow it with: GET {client.url}/v1/operations/{operation['id']}")
        return None
    printed = 0
    while True:
        steps = operation.get("steps", [])
        for step in steps[printed:]:
            if step["status"] == "running":
                break
            typer.echo(_step_line(step))
            printed += 1
        if operation["status"] in FINISHED:
            break
        if time.monotonic() >= deadline:
            typer.echo(f"gave up waiting after {timeout:.0f} s; the operation goes on", err=True)
            raise typer.Exit(EXIT_FAILED)
        time.sleep(0.2)
        operation = _call(partial(_poll, client, operation["id"]))
    if operation["status"] == "succeeded":
        typer.echo(f"{operation['status']} in {operation['duration_seconds']:.2f} s")
        return operation
    error = operation.get("error") or {}
    typer.echo(
        f"error: {error.get('code', operation['status'])}: {error.get('message', '')}", err=True
    )
    raise typer.Exit(EXIT_FAILED)


def _poll(client: Client, operation_id: str) -> dict[str, Any]:
    try:
        found: dict[str, Any] = client.get(f"/v1/operations/{operation_id}")["operation"]
        return found
    except ApiError as exc:
        if exc.code != "operation_not_found":
            raise
        typer.echo(
            f"error: operation {operation_id} is not known where this call landed: behind a "
            "Service with several pods, only the pod that runs an operation knows it, and the "
            "connection moved to another pod. Follow the fleet with 'controlplane fleet', or "
            "call one pod's address",
            err=True,
        )
        raise typer.Exit(EXIT_FAILED) from None


def _step_line(step: dict[str, Any]) -> str:
    duration = step.get("duration_seconds") or 0.0
    detail = step.get("detail") or {}
    extra = ""
    if "bytes" in detail:
        extra = f"  {detail.get('files', '?')} files, {detail['bytes']} bytes"
    mark = "ok " if step["status"] == "succeeded" else "FAILED"
    return f"  {mark} {step['name']:<8} {duration * 1000:8.1f} ms{extra}"


def _print_model(view: dict[str, Any]) -> None:
    triton = view.get("triton") or {}
    typer.echo(f"{view['name']}")
    typer.echo(f"  active:    {view.get('active_release') or '-'}")
    typer.echo(f"  previous:  {view.get('previous_release') or '-'}")
    typer.echo(f"  triton:    {triton.get('state', '?')} {triton.get('reason') or ''}".rstrip())
    for slot in view.get("slots", []):
        typer.echo(
            f"  slot {slot['name']}: {slot['state']} {slot.get('release') or ''} "
            f"({slot.get('trigger')}: {slot.get('reason')})"
        )
    releases = ", ".join(
        r["name"] + ("" if r["complete"] else " (incomplete)") for r in view.get("releases", [])
    )
    typer.echo(f"  releases:  {releases or '-'}")
    last = view.get("last_operation")
    if last:
        outcome = last["status"]
        if last.get("error"):
            outcome += f" ({last['error']['code']})"
        typer.echo(
            f"  last op:   {last['kind']} {last.get('release') or ''} {outcome} [{last['id']}]"
        )
    if view.get("running_operation"):
        typer.echo(f"  running:   {view['running_operation']}")
    fleet = view.get("fleet")
    if fleet and fleet.get("generation") is not None:
        here = fleet.get("state") or "-"
        if fleet.get("error"):
            here += f": {fleet['error']}"
        typer.echo(
            f"  fleet:     wants {fleet.get('target') or fleet.get('desired') or 'it unloaded'} "
            f"here (generation {fleet['generation']}); {fleet['member']} is {here}"
        )
    if fleet and fleet.get("stale"):
        typer.echo(
            f"  fleet:     STALE since {fleet.get('stale_since')}: the store cannot be read; "
            "serving what it has"
        )
    if fleet and fleet.get("name_conflict"):
        typer.echo(f"  fleet:     NAME CONFLICT: {fleet['name_conflict']}")
    if view.get("drift"):
        typer.echo(f"  drift:     {view['drift']} (the reconcile loop repairs it)")
    repair = view.get("last_repair")
    if repair:
        why = (repair.get("detail") or {}).get("why", "")
        typer.echo(
            f"  repaired:  {repair['status']} at {repair['created_at']}: {why} [{repair['id']}]"
        )
    _print_rollback(view)


def _print_rollback(view: dict[str, Any]) -> None:
    overload = view.get("overload")
    if overload:
        typer.echo(
            f"  overload:  {overload['verdict']} ({overload['reason']}) "
            f"[{overload['source']}, {overload['covered_seconds']:.1f} s covered]"
        )
    rollback = view.get("rollback") or {}
    typer.echo(f"  fallback:  {rollback.get('fallback') or '-'}")
    last = rollback.get("last")
    if last:
        target = last.get("to_release") or "-"
        typer.echo(
            f"  rollback:  {last['outcome']} {last.get('from_release')} -> {target} "
            f"by {last['trigger']} at {last['at']}: {last['reason']}"
        )
        if last.get("suppressed_in_cooldown"):
            typer.echo(f"             {last['suppressed_in_cooldown']} later trigger(s) held back")
    if rollback.get("cooldown_until"):
        typer.echo(f"  cooldown:  until {rollback['cooldown_until']}")
    degraded = ", ".join(d["release"] for d in rollback.get("degraded", []))
    if degraded:
        typer.echo(f"  degraded:  {degraded} (not re-promoted automatically)")


def _call(fn: Any) -> dict[str, Any]:
    try:
        result: dict[str, Any] = fn()
        return result
    except ApiError as exc:
        typer.echo(f"error: {exc.code}: {exc.message}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    except Unreachable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_UNREACHABLE) from None


def main() -> None:
    app()
