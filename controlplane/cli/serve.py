"""``controlplane serve``: load settings, check the filesystem, run the API under uvicorn."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import uvicorn

from controlplane.api.app import create_app
from controlplane.cli import logs
from controlplane.domain.errors import ControlPlaneError
from controlplane.settings import SettingsError, load_settings
from controlplane.wiring import check_filesystem

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
    return 0
