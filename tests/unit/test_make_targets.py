"""What `make run` and `make install` would run, read from `make -n` (nothing is run).

`make run` installs the daemon and the bundled Triton only; `make install` (and so `make test`
and `make check`) adds the test tools, awscli and kubectl/helm on top of the same .venv, and
neither reinstalls what the other already did. Each case points VENV at a temp dir holding the
stamps of the state it describes, so the checkout's own .venv is neither read nor touched.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


def _dry_run(target: str, venv: Path, *variables: str) -> list[str]:
    # A parent make (make check) passes its flags down, and a STORE in the environment would
    # reach the recipe: this make starts afresh.
    dropped = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "STORE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    done = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-n",
            "-C",
            str(CHECKOUT),
            target,
            f"VENV={venv}",
            f"PROTOS={venv / '_protos.py'}",
            *variables,
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout.splitlines()


def _installed(venv: Path, *stamps: str) -> Path:
    """A .venv in which the given stamps (and the generated protos) are newer than their
    sources, as right after the install that wrote them."""
    (venv / "bin").mkdir(parents=True)
    for stamp in (*stamps, "_protos.py"):
        (venv / stamp).touch()
    return venv


def _pip_installs(lines: list[str]) -> list[str]:
    return [line for line in lines if "pip install" in line]


def test_make_run_installs_the_runtime_and_the_bundled_triton_only(tmp_path: Path) -> None:
    lines = _dry_run("run", tmp_path / ".venv")

    assert [line.split(" -e ")[-1] for line in _pip_installs(lines) if " -e " in line] == [
        "'.[protos,triton]'"
    ]
    commands = "\n".join(lines)
    assert "test]" not in commands
    assert "awscli" not in commands
    assert "install-k8s-tools" not in commands
    assert lines[-1].endswith("-m devtools.devrun")


def test_make_run_passes_the_store_given(tmp_path: Path) -> None:
    lines = _dry_run("run", tmp_path / ".venv", "STORE=s3://models/prod")

    assert lines[-1].endswith('-m devtools.devrun --store "$STORE"')  # quoted by the shell


def test_make_install_completes_a_venv_made_by_make_run(tmp_path: Path) -> None:
    venv = _installed(tmp_path / ".venv", ".installed-run")

    lines = _dry_run("install", venv)

    assert f"python3 -m venv {venv}" not in lines
    assert [line.split(" -e ")[-1] for line in _pip_installs(lines) if " -e " in line] == [
        "'.[protos,triton,test]'"
    ]
    commands = "\n".join(lines)
    assert "awscli" in commands
    assert "install-k8s-tools" in commands


def test_make_run_after_make_install_installs_nothing(tmp_path: Path) -> None:
    venv = _installed(tmp_path / ".venv", ".installed-run", ".installed", ".k8s-tools")
    (venv / "awscli" / "bin").mkdir(parents=True)
    (venv / "awscli" / "bin" / "aws").touch()

    assert _dry_run("run", venv) == [f"{venv}/bin/python -m devtools.devrun"]
    assert not [line for line in _dry_run("install", venv) if "Nothing to be done" not in line]
