"""``controlplane serve``: load settings, check the filesystem, lock the state, run the API.

The locks (``wiring.claim_state``) are taken after the filesystem check, which only creates the
dirs and probes renameat2 with uniquely named dirs, and before the app is built: schema
migration and start-up reconcile run only in the one daemon that holds them, until it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
from pathlib import Path
from types import FrameType

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from controlplane.adapters.instance_lock import InstanceLock, InstanceLockError
from controlplane.adapters.keyring import KeyringError
from controlplane.api.app import create_app
from controlplane.cli import logs
from controlplane.domain.errors import ControlPlaneError
from controlplane.settings import Settings, SettingsError, load_settings, mask_passwords
from controlplane.wiring import check_filesystem, check_keyring, claim_state

log = logging.getLogger("controlplane")


KEEP_ALIVE_SECONDS = 75


def run(config: Path | None) -> int:
    try:
        settings = load_settings(config)
    except SettingsError as exc:
        print(f"controlplane: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log.level, settings.log.format)
    try:
        check_filesystem(settings)
    except ControlPlaneError as exc:
        print(f"controlplane: {exc.message}", file=sys.stderr)
        return 2
    try:
        trusted = check_keyring(settings)
    except KeyringError as exc:
        print(f"controlplane: store.keyring: {exc}", file=sys.stderr)
        return 2
    if settings.store.keyring is not None:
        log.info("keyring: trusted keys %s", ", ".join(trusted) or "none")
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
            "triton": mask_passwords(settings.triton.grpc_url),
            "repository": str(settings.repository.path),
            "staging": str(settings.staging_path),
            "store": mask_passwords(settings.store.uri),
            "database": str(settings.database_path),
            "api": f"{settings.api.host}:{settings.api.port}",
            "auth": settings.api.token is not None,
            "read_auth": settings.api.read_token is not None,
            "locks": [str(path) for path in lock.files],
        },
    )
    server = CalmServer(
        uvicorn.Config(
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
            ws="none",  # the API has no WebSocket route: no websockets or wsproto to load
        )
    )
    server.run()
    if not server.started:  # as uvicorn.run: the app's start-up failed, or the port
        sys.exit(STARTUP_FAILURE)


class CalmServer(uvicorn.Server):
    """uvicorn's server, looking once a second (not ten times) whether to stop, and woken at
    once by the signal that asks it to: at idle, its ten ticks a second were an eighth of the
    daemon's CPU. Once a second is what its Date header needs."""

    def __init__(self, config: uvicorn.Config, *, tick: float = 1.0) -> None:
        super().__init__(config)
        self._tick = tick
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def main_loop(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        counter = 0  # on_tick counts tenths of a second: it refreshes the date every 10
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864_000
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._tick):
                    await self._stop.wait()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
