"""``controlplane serve``: load settings, check the filesystem, lock the state, run the API.

The locks (``wiring.claim_state``) are taken after the filesystem check, which only creates the
dirs and probes renameat2 with uniquely named dirs, and before the app is built: schema
migration and start-up reconcile run only in the one daemon that holds them, until it exits.
"""

from __future__ import annotations

import logging
import socket
import sys
from pathlib import Path

import uvicorn

from controlplane.adapters.instance_lock import InstanceLock, InstanceLockError
from controlplane.api.app import create_app
from controlplane.cli import logs
from controlplane.domain.errors import ControlPlaneError
from controlplane.settings import Settings, SettingsError, load_settings
from controlplane.wiring import check_filesystem, claim_state

log = logging.getLogger("controlplane")


KEEP_ALIVE_SECONDS = 75


def run(config: Path | None) -> int:
    try:
        settings = load_settings(config)
    except SettingsError as exc:
        print(f"controlplane: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log.level)
    try:
        check_filesystem(settings)
    except ControlPlaneError as exc:
        print(f"controlplane: {exc.message}", file=sys.stderr)
        return 2
    try:
        lock = claim_state(settings)
    except InstanceLockError as exc:
        print(f"controlplane: {exc}", file=sys.stderr)
        return 2
    if (busy := _port_taken(settings.api.host, settings.api.port)) is not None:
        lock.release()
        print(
            f"controlplane: cannot listen on {settings.api.host}:{settings.api.port}: {busy}; "
            "another process holds it (stop it, or set api.port / CONTROLPLANE_API__PORT)",
            file=sys.stderr,
        )
        return 2
    with lock:
        _serve(settings, lock)
    return 0


def _port_taken(host: str, port: int) -> str | None:
    """Why the API's address cannot be bound, or None. Checked before start-up, so that a
    taken port is a clear refusal rather than an exit after reconcile has run."""
    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def _serve(settings: Settings, lock: InstanceLock) -> None:
    log.info(
        "starting",
        extra={
            "triton": settings.triton.grpc_url,
            "repository": str(settings.repository.path),
            "staging": str(settings.staging_path),
            "store": settings.store.uri,
            "database": str(settings.database_path),
            "api": f"{settings.api.host}:{settings.api.port}",
            "auth": settings.api.token is not None,
            "locks": [str(path) for path in lock.files],
        },
    )
    uvicorn.run(
        create_app(settings),
        host=settings.api.host,
        port=settings.api.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=15,
        # Longer than clients and load balancers keep an idle connection (httpx 5 s, an AWS
        # ALB 60 s): with uvicorn's 5 s default, a request sent on a connection just as the
        # daemon closed it was lost ("server disconnected without sending a response").
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
    )
