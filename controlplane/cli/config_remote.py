"""``controlplane config --effective --url URL``: the running daemon's settings, asked of it.

The daemon answers ``GET /v1/config`` with its settings already masked; this prints them in
the layout of the local ``config --effective`` (config_view.py), so the two read alike. A
daemon older than that route answers 404: the error says so rather than "not found".
"""

from __future__ import annotations

from typing import Any

from controlplane.cli.client import ApiError, Client
from controlplane.cli.config_view import render_remote
from controlplane.cli.output import Format, Out
from controlplane.settings import mask_passwords

PATH = "/v1/config"


def effective_of_daemon(url: str, token: str | None) -> str:
    """The YAML; an error answer exits 1 and an unreachable daemon 3, as other commands do."""
    client = Client(url, token)

    def ask() -> dict[str, Any]:
        try:
            return client.get(PATH)
        except ApiError as exc:
            if exc.status == 404:
                raise ApiError(
                    exc.status,
                    exc.code,
                    f"the daemon at {mask_passwords(url)} has no GET {PATH}: it is older than "
                    "this client. Upgrade it, or run 'controlplane config --effective' where it "
                    "runs, with its environment and --config",
                    exc.body,
                ) from exc
            if exc.status == 401:
                raise ApiError(
                    exc.status,
                    exc.code,
                    f"{exc.message} (give the token with --token or CONTROLPLANE_TOKEN)",
                    exc.body,
                ) from exc
            raise

    try:
        return render_remote(Out(Format.TABLE).call(ask), url)
    finally:
        client.close()
