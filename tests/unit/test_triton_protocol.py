"""Triton's protocol as the build step generates it: tritonclient's protos, and a clear error in
a checkout that never ran the step."""

from __future__ import annotations

import base64
import shutil
import subprocess
import sys
from pathlib import Path

from controlplane.adapters.triton import _protos, generate_protos

PACKAGE = Path(generate_protos.__file__).parents[3] / "controlplane"


def test_the_generated_protocol_is_the_installed_tritonclients() -> None:
    # make install generates it again whenever the environment changes: a stale one is a bug.
    generated = {name: base64.b64decode("".join(chunks)) for name, chunks in _protos.FILES}

    assert generated == generate_protos.descriptors()


def test_a_checkout_without_the_generated_protocol_says_how_to_make_it(tmp_path: Path) -> None:
    shutil.copytree(PACKAGE, tmp_path / "controlplane", ignore=shutil.ignore_patterns("_protos.py"))

    done = subprocess.run(
        [sys.executable, "-c", "import controlplane.adapters.triton.driver"],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: controlplane.adapters.triton._protos is missing")
    assert "make install" in last
    assert "python -m controlplane.adapters.triton.generate_protos" in last
