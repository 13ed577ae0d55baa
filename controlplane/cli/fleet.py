"""The CLI's view of the fleet: ``controlplane fleet`` as a table, and ``--fleet`` following
a model until every live member serves it.

Both read ``GET /v1/fleet``, whose ``converged`` the daemon computes; the CLI only decides when
to stop looking: the desired state is the release asked for, its rollout complete, and every
live member serves it (success); a member reports that it cannot, or the desired state moved
elsewhere (failure); or the time is up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import typer

from controlplane.cli.client import Client

POLL = 0.5


def fleet_table(data: dict[str, Any]) -> list[str]:
    members = data.get("members", [])
    models = data.get("models", {})
    lines = [f"fleet seen from {data.get('member')}" + (" (STALE)" if data.get("stale") else "")]
    if data.get("store_error"):
        lines.append(f"the store cannot be read ({data['store_error']}): as last read")
    if data.get("name_conflict"):
        lines.append(f"NAME CONFLICT: {data['name_conflict']}")
    for member in members:
        if member.get("name_conflict") and member["member"] == data.get("member"):
            continue  # said above, from this member itself
        if member.get("name_conflict") and member.get("alive"):
            lines.append(f"NAME CONFLICT on {member['member']}: {member['name_conflict']}")
    for broken in data.get("unreadable_records", []):
        lines.append(f"UNREADABLE RECORD (no member acts on it): {broken['error']}")
    lines.append("")
    lines.append(f"{'MODEL':<24} {'DESIRED':<16} {'GEN':>4} {'PHASE':<12} CONVERGED")
    for name, model in sorted(models.items()):
        lines.append(
            f"{name:<24} {model.get('desired') or '(unloaded)':<16} {model['generation']:>4} "
            f"{model['phase']:<12} {'yes' if model['converged'] else 'no'}"
        )
        if model.get("canaries"):
            lines.append(f"{'':<24} canaries: {', '.join(model['canaries'])}")
        degraded = ", ".join(d["release"] for d in model.get("degraded", []))
        if degraded:
            lines.append(f"{'':<24} degraded: {degraded}")
    if not models:
        lines.append(
            "(no readable desired state: see the unreadable records above)"
            if data.get("unreadable_records")
            else "(no model has a desired state yet)"
        )
    lines.append("")
    lines.append(f"{'MEMBER':<24} {'ALIVE':<6} {'LAST SEEN':<21} {'GPU':<9} MODELS")
    for member in members:
        served = ", ".join(
            f"{name}={state.get('release') or '-'} ({state.get('state')})"
            + (f": {state['error']}" if state.get("error") else "")
            for name, state in sorted(member.get("models", {}).items())
        )
        seen = str(member["last_seen"])[:19] + "Z"  # to the second: the table stays aligned
        lines.append(
            f"{member['member']:<24} {'yes' if member['alive'] else 'NO':<6} "
            f"{seen:<21} {member.get('overload') or '-':<9} {served or '-'}"
        )
    return lines


def follow_fleet(
    client: Client,
    model: str,
    release: str | None,
    deadline: float,
    timeout: float,
    call: Callable[[Callable[[], dict[str, Any]]], dict[str, Any]],
) -> int:
    """Print each member's state of ``model`` as it changes until every live member serves
    ``release``; 0 on success, 1 when a member cannot or the fleet moved elsewhere, 4 when
    ``timeout`` ran out first."""
    shown: dict[str, tuple[Any, ...]] = {}
    while True:
        data = call(lambda: client.get("/v1/fleet"))
        wanted = data.get("models", {}).get(model)
        for member in data.get("members", []):
            state = member.get("models", {}).get(model) or {}
            line = (member["alive"], state.get("release"), state.get("state"), state.get("error"))
            if shown.get(member["member"]) != line:
                shown[member["member"]] = line
                mark = "" if member["alive"] else " (not alive)"
                error = f": {state['error']}" if state.get("error") else ""
                typer.echo(
                    f"  member {member['member']}{mark}: {state.get('release') or '-'} "
                    f"({state.get('state') or 'no report'}){error}"
                )
        if wanted is None or wanted.get("desired") != release:
            now = "no desired state" if wanted is None else f"{wanted.get('desired')}"
            note = f" ({wanted['rollout_note']})" if wanted and wanted.get("rollout_note") else ""
            code = "member_failed" if note else "desired_state_conflict"
            typer.echo(
                f"error: {code}: the fleet's desired state of {model} is {now} now{note}", err=True
            )
            return 1
        failed = [
            f"{m['member']}: {(m['models'][model].get('error') or m['models'][model]['state'])}"
            for m in data.get("members", [])
            if m["alive"]
            and model in m.get("models", {})
            and m["models"][model].get("target") == release
            and m["models"][model].get("state") in ("failed", "held")
        ]
        if failed:
            typer.echo(f"error: member_failed: {'; '.join(failed)}", err=True)
            return 1
        if wanted.get("converged") and wanted.get("phase") == "complete":
            typer.echo(f"fleet: every live member serves {model} {release or '(unloaded)'}")
            return 0
        if time.monotonic() >= deadline:
            typer.echo(
                f"gave up waiting for the fleet after {timeout:.0f} s (phase "
                f"{wanted.get('phase')}); the members go on converging",
                err=True,
            )
            return 4
        time.sleep(POLL)
