"""What ``controlplane serve`` loads when its configuration does not use it: nothing.

Every module a daemon imports stays in its memory for good. numpy and ml_dtypes came with
tritonclient's package init (21 MiB of an idle daemon), cryptography with the keyring module
whether a keyring was configured or not (10 MiB), boto3 and botocore would with the S3 store.
Each check runs in a fresh interpreter, which imports what ``controlplane serve`` imports, runs
its start-up checks and builds the whole object graph (every adapter the settings choose), then
says which of those libraries are in ``sys.modules``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.signing import make_key

UNUSED = ("numpy", "ml_dtypes", "tritonclient", "boto3", "botocore", "cryptography")

SERVE = """
import asyncio, json, sys

from controlplane.cli import main, serve  # what the `controlplane serve` command imports
from controlplane.settings import load_settings
from controlplane.wiring import check_filesystem, check_keyring
from controlplane.wiring.graph import build

settings = load_settings(None)
check_filesystem(settings)
check_keyring(settings)
serve.create_app(settings)


async def graph() -> None:
    container = build(settings)  # what the app's start-up builds, Triton's channel included
    await container.close()


asyncio.run(graph())
print(json.dumps(sorted(m for m in sys.argv[1:] if m in sys.modules)))
"""


def loaded(tmp_path: Path, **settings: str) -> list[str]:
    """Which of :data:`UNUSED` a daemon with ``settings`` (environment variables) loads."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env |= {
        # Nothing listens there: the graph is built, no call is made.
        "CONTROLPLANE_TRITON__GRPC_URL": "127.0.0.1:9",
        "CONTROLPLANE_TRITON__METRICS_URL": "http://127.0.0.1:9/metrics",
        "CONTROLPLANE_STORE__URI": (tmp_path / "store").as_uri(),
        "CONTROLPLANE_REPOSITORY__PATH": str(tmp_path / "repository"),
        "CONTROLPLANE_STAGING__PATH": str(tmp_path / "staging"),
        "CONTROLPLANE_DATABASE__PATH": str(tmp_path / "controlplane.db"),
        **settings,
    }
    (tmp_path / "store").mkdir()
    (tmp_path / "repository").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", SERVE, *UNUSED],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found: list[str] = json.loads(done.stdout.splitlines()[-1])
    return found


def test_serve_on_a_directory_store_with_no_keyring_loads_no_numpy_tritonclient_boto3_or_crypto(
    tmp_path: Path,
) -> None:
    assert loaded(tmp_path) == []


@pytest.fixture
def keyring(tmp_path: Path) -> Path:
    """A keyring of one Ed25519 public key, written with openssl as a publisher would."""
    make_key(tmp_path / "private", "ci").public_pem(tmp_path / "keys" / "ci.pem")
    return tmp_path / "keys"


def test_a_keyring_loads_cryptography_and_nothing_else_unused(
    tmp_path: Path, keyring: Path
) -> None:
    assert loaded(tmp_path, CONTROLPLANE_STORE__KEYRING=str(keyring)) == ["cryptography"]
