"""``controlplane status``: what serves, what Triton says, the last operation; once, or live.

``last op:`` is the newest deploy, rollback, unload or cpu-fallback (what changes what
serves); ``upkeep:`` the newest of the daemon's housekeeping (a retire of the old slot, a
repair), on a line of its own so that a retire never hides the deploy before it.

The table is built from ``GET /v1/models`` (or one model's ``GET /v1/models/{name}``), plus
the daemon's jobs that are down from ``/healthz``; the document of ``-o json|yaml`` is the
models' answer alone. Store entries the daemon ignores for their names (``ignored_models``,
each model's ``ignored_releases``) take one line: on top, and under their model. ``--watch``
looks again every ``--interval`` seconds (see watch.py).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from controlplane.cli.client import Client, api_path
from controlplane.cli.fleet import paused_text, refused_line
from controlplane.cli.options import DEFAULT_URL, OutputOption, TokenOption, UrlOption, model_name
from controlplane.cli.output import Format, Out
from controlplane.cli.watch import Look, watch
from controlplane.domain.notifications import unreachable_line


def status(
    model: Annotated[
        str | None,
        typer.Argument(metavar="MODEL", help="One model; all when omitted.", callback=model_name),
    ] = None,
    watching: Annotated[
        bool,
        typer.Option(
            "--watch",
            "-w",
            help="Keep looking until Ctrl-C (exit 0): on a terminal, redraw every --interval "
            "seconds; otherwise print the view again each time it changes.",
        ),
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.1, help="Seconds between looks with --watch.")
    ] = 2.0,
    output: OutputOption = Format.TABLE,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """What serves, what Triton says, and the last operation."""
    out, client = Out(output), Client(url, token)

    def look() -> Look:
        data = client.get(api_path("v1", "models", model) if model else "/v1/models")
        health = client.get("/healthz")
        return Look(data, status_lines(data, model), problems(health, model))

    if watching:
        title = f"controlplane status{' ' + model if model else ''}"
        watch(out, look, interval, title)
    seen = out.call(look)
    out.show(seen.data, seen.lines)
    for line in seen.problems:
        out.warn(line)


def status_lines(data: dict[str, Any], model: str | None) -> list[str]:
    models = [data] if model else data.get("models", [])
    # Why the store could not be listed, above the models: an empty list is then no news.
    said = None if model else data.get("store_error")
    lines = [f"store: {said}"] if said else []
    if not model and data.get("ignored_models"):
        lines.append(f"ignored: {_names(data['ignored_models'])} (not model names: rename them)")
    if not models:
        return [*lines, "no models managed here or in the store"]
    return lines + [line for view in models for line in model_lines(view, said)]


def problems(health: dict[str, Any], model: str | None) -> list[str]:
    """What is wrong with the daemon itself: Triton cannot be reached (as the reconcile loop
    last saw it), a name conflict in the fleet, fleet records no member can act on, jobs that
    are down."""
    found = []
    triton = health.get("triton") or {}
    if triton.get("problem"):
        found.append(f"triton: {triton['problem']}")
    conflict = (health.get("fleet") or {}).get("name_conflict")
    if conflict and not model:  # one model's view says it under that model
        found.append(f"fleet: NAME CONFLICT: {conflict}")
    for refused in (health.get("fleet") or {}).get("refused_records", []):
        if not model:  # one model's view says its own under that model
            found.append(refused_line(refused))
    queue = (health.get("store") or {}).get("notifications") or {}
    if queue.get("state") == "unreachable":
        found.append(unreachable_line(queue["queue"], queue.get("problem"), queue.get("since")))
    for job in health.get("jobs", []):
        if job["state"] != "running":
            found.append(
                f"job {job['name']}: {job['state']} after {job['restarts']} restart(s): "
                f"{job.get('last_error') or '-'}"
            )
    return found


def model_lines(view: dict[str, Any], said: str | None = None) -> list[str]:
    """``said``: the store's error as printed already above the models."""
    triton = view.get("triton") or {}
    lines = [
        f"{view['name']}",
        f"  active:    {view.get('active_release') or '-'}",
        f"  previous:  {view.get('previous_release') or '-'}",
        f"  triton:    {triton.get('state', '?')} {triton.get('reason') or ''}".rstrip(),
    ]
    if view.get("signer"):
        lines.insert(2, f"  signed by: {view['signer']}")
    if view.get("cpu_only"):
        lines.insert(2, "  cpu only:  yes (the rollback chain's last step): deploy to serve on GPU")
    for slot in view.get("slots", []):
        lines.append(
            f"  slot {slot['name']}: {slot['state']} {slot.get('release') or ''} "
            f"({slot.get('trigger')}: {slot.get('reason')})"
        )
    releases = ", ".join(
        r["name"] + ("" if r["complete"] else " (incomplete)") for r in view.get("releases", [])
    )
    lines.append(f"  releases:  {releases or '-'}")
    if view.get("ignored_releases"):
        ignored = _names(view["ignored_releases"])
        lines.append(f"  ignored:   {ignored} (not release names: rename them)")
    if view.get("store_error") and view["store_error"] != said:
        lines.append(f"  store:     {view['store_error']}")
    last = view.get("last_operation")
    if last:
        lines.append(f"  last op:   {_operation(last)}")
    upkeep = view.get("last_housekeeping")
    if upkeep:
        lines.append(f"  upkeep:    {_housekeeping(upkeep)}")
    if view.get("running_operation"):
        lines.append(f"  running:   {view['running_operation']}")
    out = view.get("out_of_rotation") or {}
    if out:
        lines.append(f"  rotation:  out: {out['message']}")
    lines += _fleet_lines(view.get("fleet"))
    drift = view.get("drift")
    if drift:  # a held model's the loop leaves alone: its own words say what to do
        held = out.get("reason") == "memory_not_returned"
        lines.append(f"  drift:     {drift}{'' if held else ' (the reconcile loop repairs it)'}")
    repair = view.get("last_repair")
    if repair:
        why = (repair.get("detail") or {}).get("why", "")
        lines.append(
            f"  repaired:  {repair['status']} at {repair['created_at']}: {why} [{repair['id']}]"
        )
    return lines + _rollback_lines(view)


def _operation(op: dict[str, Any]) -> str:
    """One operation on a line: kind, release, outcome (with the error's code), id."""
    return f"{op['kind']} {op.get('release') or ''} {_outcome(op)} [{op['id']}]"


def _housekeeping(op: dict[str, Any]) -> str:
    """A retire or a repair on a line: it names no release (a retire frees a slot), so when it
    ran and why (the slot, the repair's finding) say what it did."""
    why = f": {op['reason']}" if op.get("reason") else ""
    return f"{op['kind']} {_outcome(op)} at {op['created_at']}{why} [{op['id']}]"


def _outcome(op: dict[str, Any]) -> str:
    error = op.get("error")
    return f"{op['status']} ({error['code']})" if error else str(op["status"])


def _names(ignored: list[dict[str, Any]]) -> str:
    """Store entries left out for their names, quoted: untrusted text, so repr() escapes what
    a terminal would act on. Why each was left out is in -o json and the daemon's log."""
    return ", ".join(repr(str(entry.get("name"))) for entry in ignored)


def _fleet_lines(fleet: dict[str, Any] | None) -> list[str]:
    if not fleet:
        return []
    lines = []
    if fleet.get("generation") is not None:
        here = fleet.get("state") or "-"
        if fleet.get("error"):
            here += f": {fleet['error']}"
        lines.append(
            f"  fleet:     wants {fleet.get('target') or fleet.get('desired') or 'it unloaded'} "
            f"here (generation {fleet['generation']}); {fleet['member']} is {here}"
        )
    if paused := fleet.get("paused"):
        lines.append(f"  fleet:     {paused_text(paused)}")
    if fleet.get("stale"):
        lines.append(
            f"  fleet:     STALE since {fleet.get('stale_since')}: the store cannot be read; "
            "serving what it has"
        )
    if fleet.get("name_conflict"):
        lines.append(f"  fleet:     NAME CONFLICT: {fleet['name_conflict']}")
    for refused in fleet.get("refused", []):
        lines.append(f"  fleet:     {refused_line(refused)}")
    return lines


def _rollback_lines(view: dict[str, Any]) -> list[str]:
    lines = []
    overload = view.get("overload")
    if overload:
        lines.append(
            f"  overload:  {overload['verdict']} ({overload['reason']}) "
            f"[{overload['source']}, {overload['covered_seconds']:.1f} s covered]"
        )
    rollback = view.get("rollback") or {}
    lines.append(f"  fallback:  {rollback.get('fallback') or '-'}")
    last = rollback.get("last")
    if last:
        target = last.get("to_release") or "-"
        lines.append(
            f"  rollback:  {last['outcome']} {last.get('from_release')} -> {target} "
            f"by {last['trigger']} at {last['at']}: {last['reason']}"
        )
        if last.get("suppressed_in_cooldown"):
            held = last["suppressed_in_cooldown"]
            lines.append(f"             {held} later trigger(s) held back")
    if rollback.get("cooldown_until"):
        lines.append(f"  cooldown:  until {rollback['cooldown_until']}")
    degraded = ", ".join(d["release"] for d in rollback.get("degraded", []))
    if degraded:
        lines.append(f"  degraded:  {degraded} (not re-promoted automatically)")
    return lines
