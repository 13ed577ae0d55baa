"""The CLI's view of the fleet: ``controlplane fleet`` as a table, and ``--fleet`` following
a model until every live member serves it.

Both read ``GET /v1/fleet``, whose ``converged`` the daemon computes; the CLI only decides when
to stop looking: the desired state is the release asked for, its rollout complete, and every
live member serves it (success); a member reports that it cannot, or the desired state moved
elsewhere (failure); or the time is up.
"""

from __future__ import annotations

import time
from typing import Any

from controlplane.cli.client import Client
from controlplane.cli.options import DEFAULT_URL, OutputOption, TokenOption, UrlOption
from controlplane.cli.output import EXIT_FAILED, EXIT_GAVE_UP, Format, Out

POLL = 0.5


def fleet(
    output: OutputOption = Format.TABLE, url: UrlOption = DEFAULT_URL, token: TokenOption = None
) -> None:
    """The fleet: each member (alive or not, what it serves) and each model's desired state."""
    out = Out(output)
    data = out.call(lambda: Client(url, token).get("/v1/fleet"))
    out.show(data, fleet_table(data))


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
        lines.append(refused_line(broken))
    lines.append("")
    lines.append(f"{'MODEL':<24} {'DESIRED':<16} {'GEN':>4} {'PHASE':<12} CONVERGED")
    for name, model in sorted(models.items()):
        lines.append(
            f"{name:<24} {model.get('desired') or '(unloaded)':<16} {model['generation']:>4} "
            f"{model['phase']:<12} {'yes' if model['converged'] else 'no'}"
        )
        if model.get("canaries"):
            lines.append(f"{'':<24} canaries: {', '.join(model['canaries'])}")
        if model.get("paused"):
            lines.append(f"{'':<24} {paused_text(model['paused'])}")
        if model.get("turns"):
            out_now = ", ".join(t["member"] for t in model["turns"])
            lines.append(f"{'':<24} out of rotation (rolling): {out_now}")
        degraded = ", ".join(d["release"] for d in model.get("degraded", []))
        if degraded:
            lines.append(f"{'':<24} degraded: {degraded}")
    if not models:
        lines.append(
            "(no readable desired state: see the refused records above)"
            if data.get("unreadable_records")
            else "(no model has a desired state yet)"
        )
    lines.append("")
    lines.append(f"{'MEMBER':<24} {'ALIVE':<6} {'LAST SEEN':<21} {'GPU':<9} MODELS")
    for member in members:
        served = ", ".join(
            f"{name}={state.get('release') or '-'} ({state.get('state')})"
            + (f": {one_line(state['error'])}" if state.get("error") else "")
            + (f" [{rolling}]" if (rolling := rolling_text(state)) else "")
            for name, state in sorted(member.get("models", {}).items())
        )
        seen = str(member["last_seen"])[:19] + "Z"  # to the second: the table stays aligned
        lines.append(
            f"{member['member']:<24} {'yes' if member['alive'] else 'NO':<6} "
            f"{seen:<21} {member.get('overload') or '-':<9} {served or '-'}"
        )
        if ahead := member.get("clock_ahead_seconds"):
            way = "ahead of" if ahead > 0 else "behind"
            lines.append(
                f"{'':<24} its clock is {abs(ahead)} s {way} the one of the member answering "
                "(times it writes are off by that much; liveness goes by the store's)"
            )
    return lines


def paused_text(paused: dict[str, Any]) -> str:
    """Who paused a rollout, when and why, in one line."""
    why = f": {one_line(str(paused['reason']))}" if paused.get("reason") else ""
    return (
        f"PAUSED by {paused.get('by')} at {str(paused.get('at'))[:19]}Z{why} "
        "(controlplane rollout resume MODEL)"
    )


def rolling_text(state: dict[str, Any]) -> str:
    """A member's rolling update of one model in a few words, as the daemon says it."""
    rolling = state.get("rolling")
    return str(rolling.get("summary") or "") if rolling else ""


def model_across(data: dict[str, Any], model: str) -> dict[str, Any]:
    """One model across the fleet, from ``GET /v1/fleet``: its desired state and each member's
    state of it (the shape of the API's ``fleet`` answer to a deploy with ``"fleet": true``)."""
    wanted = data.get("models", {}).get(model)
    return {
        "model": model,
        **(wanted if wanted is not None else {"desired": None}),
        "members": [
            {
                "member": member["member"],
                "alive": member["alive"],
                **(member.get("models", {}).get(model) or NO_REPORT),
            }
            for member in data.get("members", [])
        ],
    }


def refused_line(refused: dict[str, Any]) -> str:
    """A record of the fleet a member refuses, in one line: why (a label) and in words. A
    refused desired state: no member acts on its model; a refused heartbeat: its member is
    not seen."""
    return f"REFUSED RECORD ({refused.get('reason')}): {one_line(str(refused.get('error')))}"


def one_line(text: str) -> str:
    """``text`` on one line (a member's error may hold a traceback): a table stays a table."""
    return " ".join(str(text).split())


NO_REPORT = {"release": None, "state": None, "target": None, "error": None}


def follow_fleet(
    out: Out,
    client: Client,
    model: str,
    release: str | None,
    deadline: float,
    timeout: float,
    answer: dict[str, Any],
) -> dict[str, Any]:
    """Print each member's state of ``model`` as it changes until every live member serves
    ``release``; the model across the fleet then. Exits 1 when a member cannot or the fleet
    moved elsewhere, 4 when ``timeout`` ran out first, each with ``answer`` (the operation)
    and the fleet as last seen. A view the daemon could not read from the store again says
    nothing of the others now: it is waited out."""
    shown: dict[str, tuple[Any, ...]] = {}
    while True:
        data = out.call(lambda: client.get("/v1/fleet"))
        across = model_across(data, model)
        wanted = data.get("models", {}).get(model)
        _say_changes(out, data, model, shown)
        if not data.get("store_error"):
            refusal = _refusal(data, model, release, wanted)
            if refusal is not None:
                code, message = refusal
                raise out.fail(EXIT_FAILED, code, message, {**answer, "fleet": across})
            if wanted.get("converged") and wanted.get("phase") == "complete":
                out.say(f"fleet: every live member serves {model} {release or '(unloaded)'}")
                return across
        if time.monotonic() >= deadline:
            phase = wanted.get("phase") if wanted else "unknown"
            raise out.fail(
                EXIT_GAVE_UP,
                "gave_up_waiting",
                f"gave up waiting for the fleet after {timeout:g} s (phase {phase}); the "
                "members go on converging: watch them with controlplane fleet",
                {**answer, "fleet": across},
            )
        time.sleep(POLL)


def _say_changes(
    out: Out, data: dict[str, Any], model: str, shown: dict[str, tuple[Any, ...]]
) -> None:
    """A line for each member whose state of ``model`` changed, and for the store going away."""
    for member in data.get("members", []):
        state = member.get("models", {}).get(model) or {}
        rolling = rolling_text(state)
        line = (
            member["alive"],
            state.get("release"),
            state.get("state"),
            state.get("error"),
            rolling,
        )
        if shown.get(member["member"]) != line:
            shown[member["member"]] = line
            mark = "" if member["alive"] else " (not alive)"
            error = f": {one_line(state['error'])}" if state.get("error") else ""
            out.say(
                f"  member {member['member']}{mark}: {state.get('release') or '-'} "
                f"({state.get('state') or 'no report'}){error}"
                + (f" [{rolling}]" if rolling else "")
            )
    store = (data.get("store_error"),)
    if store[0] and shown.get("(store)") != store:
        out.say(f"  the fleet's records cannot be read: {store[0]}; waiting")
    shown["(store)"] = store


def _refusal(
    data: dict[str, Any], model: str, release: str | None, wanted: dict[str, Any] | None
) -> tuple[str, str] | None:
    """Why the wait ends without the release serving everywhere: (code, message)."""
    if wanted is None or wanted.get("desired") != release:
        now = "no desired state" if wanted is None else f"{wanted.get('desired')}"
        note = f" ({wanted['rollout_note']})" if wanted and wanted.get("rollout_note") else ""
        code = "member_failed" if note else "desired_state_conflict"
        return code, f"the fleet's desired state of {model} is {now} now{note}"
    failed = [
        f"{m['member']}: {one_line(m['models'][model].get('error') or m['models'][model]['state'])}"
        for m in data.get("members", [])
        if m["alive"]
        and model in m.get("models", {})
        and m["models"][model].get("target") == release
        and m["models"][model].get("state") in ("failed", "held")
    ]
    return ("member_failed", "; ".join(failed)) if failed else None
