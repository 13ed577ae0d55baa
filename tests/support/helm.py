"""The helm that renders the chart in tests: the one `make install` puts in the venv.

tools/install-k8s-tools.py unpacks helm 3 beside kubectl (tests/support/kubectl.py) from the same
hash-pinned wheel. Tests use that binary, never one found on PATH; a missing one fails the test,
as in CI, where `make test` installs it.
"""

from __future__ import annotations

import subprocess
import sysconfig
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

HELM = Path(sysconfig.get_path("scripts")) / "helm"
CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "controlplane"
# What deploy/helm/check.sh renders with, and the namespace the kustomize overlays use.
RELEASE = "controlplane"
NAMESPACE = "triton"


def helm() -> str:
    if not HELM.is_file():
        pytest.fail(f"{HELM} is missing: run `make install` (tools/install-k8s-tools.py)")
    return str(HELM)


def helm_template(
    values: Sequence[Path] = (),
    settings: Mapping[str, str] | None = None,
    *,
    chart: Path = CHART,
    show_only: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart as a user renders it: values files, then --set overrides."""
    command = [helm(), "template", RELEASE, str(chart), "--namespace", NAMESPACE]
    for path in values:
        command += ["--values", str(path)]
    for key, value in (settings or {}).items():
        command += ["--set", f"{key}={value}"]
    if show_only is not None:
        command += ["--show-only", show_only]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
