"""``controlplane serve`` refuses bad settings and filesystems with exit code 2 and a clear line.

Each case runs the real command in a subprocess with a clean environment; every refusal here
happens before the daemon binds a port or reaches Triton, so nothing is left running.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from controlplane.cli.serve import CalmServer
from tests.support.polling import until
from tests.support.signing import openssl

REPO_ROOT = Path(__file__).resolve().parents[2]
EXIT_USAGE = 2


def clean_env(**settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env.update(settings)
    return env


def serve(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controlplane", "serve"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def without_settings(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """One run with no settings at all, shared by the tests that read its output."""
    return serve(clean_env(), tmp_path_factory.mktemp("no-settings"))


def test_no_settings_at_all(without_settings: subprocess.CompletedProcess[str]) -> None:
    result = without_settings

    assert result.returncode == EXIT_USAGE, result.stderr
    assert "repository" in result.stderr
    assert "store" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_no_settings_names_the_fields_to_set(
    without_settings: subprocess.CompletedProcess[str],
) -> None:
    result = without_settings
    assert result.returncode == EXIT_USAGE
    assert "repository.path" in result.stderr
    assert "store.uri" in result.stderr


def test_an_invalid_port(tmp_path: Path) -> None:
    env = clean_env(
        CONTROLPLANE_REPOSITORY__PATH=str(tmp_path / "repository"),
        CONTROLPLANE_STORE__URI=(tmp_path / "store").as_uri(),
        CONTROLPLANE_API__PORT="notaport",
    )
    result = serve(env, tmp_path)

    assert result.returncode == EXIT_USAGE, result.stderr
    assert "api.port" in result.stderr
    assert "CONTROLPLANE_API__PORT" in result.stderr
    assert "Traceback" not in result.stderr


def test_staging_on_another_filesystem(
    tmp_path: Path,
    other_filesystem: Path,
) -> None:
    shm_staging = other_filesystem / "staging"
    env = clean_env(
        CONTROLPLANE_REPOSITORY__PATH=str(tmp_path / "root" / "repository"),
        CONTROLPLANE_STAGING__PATH=str(shm_staging),
        CONTROLPLANE_STORE__URI=(tmp_path / "store").as_uri(),
        CONTROLPLANE_DATABASE__PATH=str(tmp_path / "root" / "controlplane.db"),
    )
    result = serve(env, tmp_path)

    assert result.returncode == EXIT_USAGE, result.stderr
    assert "different filesystems" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "root" / "controlplane.db").exists()  # refused before anything else


def test_a_keyring_with_an_rsa_key_is_refused_naming_the_file(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    private = tmp_path / "rsa.key"
    openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024", "-out", private)
    openssl("pkey", "-in", private, "-pubout", "-out", keys / "old-ci.pem")
    env = clean_env(
        CONTROLPLANE_REPOSITORY__PATH=str(tmp_path / "root" / "repository"),
        CONTROLPLANE_STORE__URI=(tmp_path / "store").as_uri(),
        CONTROLPLANE_STORE__KEYRING=str(keys),
    )
    result = serve(env, tmp_path)

    assert result.returncode == EXIT_USAGE, result.stderr
    assert f"store.keyring: {keys / 'old-ci.pem'} holds an RSA key" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_server_stops_at_once_when_a_signal_asks_between_its_ticks(tmp_path: Path) -> None:
    """It looks whether to stop once a second rather than ten times; the signal must not wait
    for that look (here an hour away)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "lifespan"
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})

    async def scenario() -> None:
        server = CalmServer(
            uvicorn.Config(app, uds=str(tmp_path / "api.sock"), log_config=None), tick=3600.0
        )
        serving = asyncio.create_task(server.serve())
        await until(lambda: server.started, "the server started")
        await asyncio.sleep(0)  # into its wait for the next tick

        server.handle_exit(signal.SIGTERM, None)

        async with asyncio.timeout(10.0):
            await serving

    # uvicorn raises the signal again once it has stopped, for the handler it found: this one.
    passed_on: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda sig, _frame: passed_on.append(sig))
    try:
        asyncio.run(scenario())
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert passed_on == [signal.SIGTERM]
