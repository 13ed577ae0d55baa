"""``controlplane serve``: load settings, check the filesystem, lock the state, run the API.

The locks (``wiring.claim_state``) are taken after the filesystem check, which only creates the
dirs and probes renameat2 with uniquely named dirs, and before the app is built: schema
migration and start-up reconcile run only in the one daemon that holds them, until it exits.
"""

from __future__ import annotations

import logging
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
    with lock:
        _serve(settings, lock)
    return 0


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
    )
