"""What happened: ``controlplane operations`` (recent operations, or one in full) and
``controlplane history MODEL`` (a model's operations with who and why).

Both read ``GET /v1/operations``, newest first. Each daemon's journal holds the operations it
ran itself: in a fleet, ask the member whose history you want (``--url``); the operations a
member ran to follow the fleet name who set the desired state they followed.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from controlplane.cli.client import Client, api_path
from controlplane.cli.follow import step_line
from controlplane.cli.options import (
    DEFAULT_URL,
    ModelArgument,
    ModelFilterOption,
    OutputOption,
    TokenOption,
    UrlOption,
)
from controlplane.cli.output import Format, Out, columns

LimitOption = Annotated[
    int, typer.Option("--limit", min=1, max=500, help="At most this many, newest first.")
]


def operations(
    operation_id: Annotated[
        str | None,
        typer.Argument(metavar="OPERATION", help="One operation, with its steps."),
    ] = None,
    model: ModelFilterOption = None,
    limit: LimitOption = 20,
    output: OutputOption = Format.TABLE,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """Recent operations, newest first; or one OPERATION with its steps and timings."""
    out, client = Out(output), Client(url, token)
    if operation_id is not None:
        data = out.call(lambda: client.get(api_path("v1", "operations", operation_id)))
        out.show(data, operation_lines(data["operation"]))
        return
    data = out.call(lambda: client.get(api_path("v1", "operations", limit=limit, model=model)))
    found = data.get("operations", [])
    rows = [
        (
            op["id"],
            _when(op["created_at"]),
            op["kind"],
            op["model"],
            op.get("release") or "-",
            op["trigger"],
            _outcome(op),
            _took(op),
        )
        for op in found
    ]
    header = ("ID", "STARTED", "KIND", "MODEL", "RELEASE", "TRIGGER", "STATUS", "TOOK")
    out.show(data, columns(header, rows) if found else ["no operations recorded here"])


def history(
    model: ModelArgument,
    limit: LimitOption = 20,
    output: OutputOption = Format.TABLE,
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
) -> None:
    """MODEL's operations, newest first: what changed, who started it and why."""
    out, client = Out(output), Client(url, token)
    data = out.call(lambda: client.get(api_path("v1", "operations", model=model, limit=limit)))
    found = data.get("operations", [])
    rows = [
        (
            _when(op["created_at"]),
            op["id"],
            op["kind"],
            _change(op),
            _outcome(op),
            _who(op),
            op.get("member") or "-",
            op.get("reason") or "-",
        )
        for op in found
    ]
    header = ("WHEN", "OPERATION", "KIND", "CHANGE", "STATUS", "BY", "MEMBER", "WHY")
    empty = [f"no operations of {model} recorded here"]
    out.show(data, columns(header, rows) if found else empty)


def operation_lines(op: dict[str, Any]) -> list[str]:
    lines = [
        f"operation {op['id']}: {op['kind']} {op['model']} {_change(op)}",
        f"  status:    {_outcome(op)}" + (f" in {_took(op)}" if op.get("finished_at") else ""),
        f"  by:        {_who(op)}" + (f" on {op['member']}" if op.get("member") else ""),
    ]
    if op.get("reason"):
        lines.append(f"  why:       {op['reason']}")
    signer = (op.get("detail") or {}).get("signer")
    if signer:
        lines.append(f"  signed by: {signer}")
    lines.append(f"  started:   {_when(op['created_at'])}")
    if op.get("error"):
        lines.append(f"  error:     {op['error']['code']}: {op['error']['message']}")
    lines += [step_line(step) for step in op.get("steps", []) if step["status"] != "running"]
    lines += [f"  ... {s['name']}" for s in op.get("steps", []) if s["status"] == "running"]
    return lines


def _when(stamp: str | None) -> str:
    """An ISO time in UTC to the second, the way every table here prints it."""
    return "-" if not stamp else stamp[:19] + "Z"


def _change(op: dict[str, Any]) -> str:
    before, after = op.get("from_release"), op.get("release")
    if op["kind"] == "unload":
        return f"{before or '-'} -> (unloaded)"
    if before and after and before != after:
        return f"{before} -> {after}"
    return str(after or before or "-")


def _outcome(op: dict[str, Any]) -> str:
    error = op.get("error")
    return str(op["status"]) + (f" ({error['code']})" if error else "")


def _took(op: dict[str, Any]) -> str:
    seconds = op.get("duration_seconds")
    return "-" if seconds is None else f"{seconds:.2f} s"


def _who(op: dict[str, Any]) -> str:
    """The trigger, and for one that followed the fleet, the member that set what it followed."""
    return str(op["trigger"]) + (f" (set by {op['set_by']})" if op.get("set_by") else "")
