"""Following one operation to its end: ``--wait`` and ``controlplane wait``.

Each step is printed once, as it ends. The outcome is the exit code: 0 succeeded, 1 failed or
interrupted, 4 when the time given ran out first (the operation goes on in the daemon; nothing
here cancels it). Polls reuse the command's one connection (see client.py), so behind a Service
they reach the pod that runs the operation.
"""

from __future__ import annotations

import shlex
import time
from typing import Any

from controlplane.cli.client import ApiError, Client, api_path
from controlplane.cli.options import DEFAULT_URL
from controlplane.cli.output import EXIT_FAILED, EXIT_GAVE_UP, Out

FINISHED = ("succeeded", "failed", "interrupted")
POLL = 0.2


def follow(
    out: Out, client: Client, operation: dict[str, Any], deadline: float, timeout: float
) -> dict[str, Any]:
    """Print ``operation``'s steps as they end until it ends; the operation once succeeded.
    A failure exits 1 and running out of time exits 4, each with the operation as last seen."""
    printed = 0
    while True:
        for step in operation.get("steps", [])[printed:]:
            if step["status"] == "running":
                break
            out.say(step_line(step))
            printed += 1
        if operation["status"] in FINISHED:
            break
        if time.monotonic() >= deadline:
            raise out.fail(
                EXIT_GAVE_UP,
                "gave_up_waiting",
                f"gave up waiting after {timeout:g} s; the operation goes on: follow it with "
                f"{follow_command(client, operation['id'])}",
                {"operation": operation},
            )
        time.sleep(POLL)
        operation = fetch(out, client, operation["id"])
    if operation["status"] == "succeeded":
        out.say(f"succeeded in {operation['duration_seconds']:.2f} s")
        return operation
    error = operation.get("error") or {}
    raise out.fail(
        EXIT_FAILED,
        error.get("code", operation["status"]),
        error.get("message", ""),
        {"operation": operation},
    )


def follow_command(client: Client, operation_id: str) -> str:
    """The command that follows ``operation_id`` to its end, to paste as it is: it names the
    daemon unless it is the default one (a token is never printed; it comes from
    CONTROLPLANE_TOKEN or --token)."""
    words = ["controlplane", "wait", operation_id]
    if client.url.rstrip("/") != DEFAULT_URL:
        words += ["--url", client.url]
    return shlex.join(words)


def say_how_to_follow(out: Out, client: Client, operation_id: str) -> None:
    out.say(f"follow it with: {follow_command(client, operation_id)}")
    out.say(f"  (or GET {client.url.rstrip('/')}/v1/operations/{operation_id})")


def fetch(out: Out, client: Client, operation_id: str) -> dict[str, Any]:
    """The operation as the daemon has it now; unknown there, say why that may be and exit 1."""

    def get() -> dict[str, Any]:
        try:
            answer = client.get(api_path("v1", "operations", operation_id))
            found: dict[str, Any] = answer["operation"]
            return found
        except ApiError as exc:
            if exc.code != "operation_not_found":
                raise
        raise out.fail(
            EXIT_FAILED,
            "operation_not_found",
            f"operation {operation_id} is not known where this call landed: behind a Service "
            "with several pods, only the pod that runs an operation knows it, and the "
            "connection moved to another pod. Follow the fleet with 'controlplane fleet', or "
            "call one pod's address",
        )

    return out.call(get)


def step_line(step: dict[str, Any]) -> str:
    duration = step.get("duration_seconds") or 0.0
    detail = step.get("detail") or {}
    extra = ""
    if "bytes" in detail:
        extra = f"  {detail.get('files', '?')} files, {detail['bytes']} bytes"
    elif step["name"] == "stress" and isinstance(detail.get("new"), dict):
        extra = "  " + _stress_figures(detail)
    mark = "ok " if step["status"] == "succeeded" else "FAILED"
    return f"  {mark} {step['name']:<8} {duration * 1000:8.1f} ms{extra}"


def _stress_figures(detail: dict[str, Any]) -> str:
    """The stress step in a few words: the new slot's requests, errors and p99, and the
    serving slot's p99 beside it."""
    new = detail["new"]
    said = f"{new.get('requests', '?')} requests, {new.get('errors', '?')} errors"
    said += f", p99 {_ms(new.get('p99_ms'))}"
    active = detail.get("active")
    if isinstance(active, dict):
        said += f" vs {_ms(active.get('p99_ms'))} serving"
    return said


def _ms(value: object) -> str:
    return f"{value:.1f} ms" if isinstance(value, int | float) else "-"
