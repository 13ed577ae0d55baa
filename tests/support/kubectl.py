"""The kubectl that renders the manifests in tests: the one `make install` puts in the venv.

tools/install-k8s-tools.py unpacks kubectl 1.32 (kustomize v5) from a hash-pinned PyPI wheel into
the venv's bin/, beside this Python. Tests use that binary and never one found on PATH, which
may be any version (Debian's is 1.20). A missing one fails the test, here and in CI alike:
`make test` installs it, so a skip would only hide a broken install step.
"""

from __future__ import annotations

import subprocess
import sysconfig
from pathlib import Path

import pytest

KUBECTL = Path(sysconfig.get_path("scripts")) / "kubectl"
# The Kubernetes version the manifests are rendered and validated for (deploy/k8s/check.sh).
K8S_VERSION = "1.32.0"


def kubectl() -> str:
    if not KUBECTL.is_file():
        pytest.fail(f"{KUBECTL} is missing: run `make install` (tools/install-k8s-tools.py)")
    return str(KUBECTL)


def kustomize(directory: Path) -> subprocess.CompletedProcess[str]:
    """`kubectl kustomize directory`, as `kubectl apply -k` renders it."""
    return subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
