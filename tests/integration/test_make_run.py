"""``make run`` keeps Triton running as a pod's kubelet would: when Triton's process ends (the
daemon's ``memory.on_not_returned: restart-triton`` stops it on purpose), it is started again on
the same ports, and the daemon serves on; Ctrl-C still stops both."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from tests.support.polling import eventually
from tests.support.readme_servers import CHECKOUT, START_TIMEOUT, STOP_TIMEOUT

pytestmark = pytest.mark.triton


def _log(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def _live(url: str) -> bool:
    try:
        return httpx.get(f"{url}/v2/health/live", timeout=2.0).status_code == 200
    except httpx.TransportError:
        return False


def _tritonserver(repository: Path) -> psutil.Process:
    [found] = [
        p
        for p in psutil.process_iter(["name", "cmdline"])
        if p.info["name"] == "tritonserver"
        and f"--model-repository={repository}" in (p.info["cmdline"] or [])
    ]
    return found


def test_make_run_starts_triton_again_when_it_exits(tmp_path: Path, triton_cache: Path) -> None:
    state = tmp_path / ".state"
    state.mkdir()
    (state / "triton-cache").symlink_to(triton_cache)  # the server tree, prepared once
    log = tmp_path / "make-run.log"
    python_path = os.pathsep.join([str(CHECKOUT), *filter(None, [os.environ.get("PYTHONPATH")])])
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "devtools.devrun"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": python_path},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        eventually(
            lambda: process.poll() is not None or "controlplane is running" in _log(log),
            START_TIMEOUT,
            "make run printing its guide",
        )
        assert process.poll() is None, _log(log)
        triton_url = re.findall(r"Triton\s+HTTP (\S+)", _log(log))[0]
        api_url = re.findall(r"daemon\s+(http://\S+)", _log(log))[0]
        first = _tritonserver((state / "repository").resolve())

        first.kill()
        eventually(lambda: "Triton is live again" in _log(log), START_TIMEOUT, "Triton again")
        again = _tritonserver((state / "repository").resolve())

        assert again.pid != first.pid
        assert _live(triton_url)
        eventually(
            lambda: httpx.get(f"{api_url}/readyz", timeout=2.0).status_code == 200,
            60,
            "the daemon ready with the new Triton",
        )
        assert process.poll() is None
    finally:
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C
        code = process.wait(STOP_TIMEOUT)
    assert code == 0, _log(log)
    assert not _live(triton_url)
