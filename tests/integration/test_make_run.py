"""``make run`` keeps Triton running as a pod's kubelet would: when Triton's process ends (the
daemon's ``memory.on_not_returned: restart-triton`` stops it on purpose), it is started again on
the same ports, and the daemon serves on; Ctrl-C still stops both. ``make run STORE=...`` serves
a store of one's own, and a STORE it could not use is refused before Triton starts."""

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

from tests.support.inference import infer_once
from tests.support.models import write_scale_release
from tests.support.polling import eventually
from tests.support.readme_servers import CHECKOUT, START_TIMEOUT, STOP_TIMEOUT, VENV_BIN

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


def _make_run(
    tmp_path: Path, triton_cache: Path, *args: str
) -> tuple[subprocess.Popen[bytes], Path]:
    """`make run`'s recipe (with `args`, as `STORE=` passes them) in tmp_path, its output in
    the returned log."""
    state = tmp_path / ".state"
    state.mkdir()
    (state / "triton-cache").symlink_to(triton_cache)  # the server tree, prepared once
    log = tmp_path / "make-run.log"
    python_path = os.pathsep.join([str(CHECKOUT), *filter(None, [os.environ.get("PYTHONPATH")])])
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "devtools.devrun", *args],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": python_path},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process, log


def _wait_for_guide(process: subprocess.Popen[bytes], log: Path) -> None:
    eventually(
        lambda: process.poll() is not None or "controlplane is running" in _log(log),
        START_TIMEOUT,
        "make run printing its guide",
    )
    assert process.poll() is None, _log(log)


def _stop(process: subprocess.Popen[bytes], log: Path) -> None:
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C
    code = process.wait(STOP_TIMEOUT)
    assert code == 0, _log(log)


def test_make_run_starts_triton_again_when_it_exits(tmp_path: Path, triton_cache: Path) -> None:
    state = tmp_path / ".state"
    process, log = _make_run(tmp_path, triton_cache)
    try:
        _wait_for_guide(process, log)
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


def test_make_run_serves_a_store_of_ones_own(tmp_path: Path, triton_cache: Path) -> None:
    store = tmp_path / "my store"
    write_scale_release(store, "mine", "r1", k=5.0)
    process, log = _make_run(tmp_path, triton_cache, "--store", str(store))
    try:
        _wait_for_guide(process, log)
        assert _log(log).splitlines()[0] == f"store: file://{store}"
        api_url = re.findall(r"daemon\s+(http://\S+)", _log(log))[0]
        grpc_url = re.findall(r"gRPC (\S+)", _log(log))[0]
        assert f"(store: file://{store})" in _log(log)

        deploy = subprocess.run(
            [str(VENV_BIN / "controlplane"), "deploy", "mine", "r1", "--wait", "--url", api_url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

        assert deploy.returncode == 0, deploy.stdout + deploy.stderr
        assert infer_once(grpc_url, "mine", 2.0) == 10.0
    finally:
        _stop(process, log)


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("missing", "no such directory"),
        ("a-file", "not a directory"),
        ("s3://Not_A_Bucket/prefix", "'Not_A_Bucket' is not an S3 bucket name"),
        ("ftp://host/models", "not a store the daemon reads"),
        # Credentials in the URI are refused without being echoed.
        ("s3://AKIAEXAMPLE:hunter2@models/prod", "names the bucket only"),
    ],
)
def test_make_run_refuses_a_store_it_cannot_use_before_triton_starts(
    tmp_path: Path, triton_cache: Path, given: str, said: str
) -> None:
    (tmp_path / "a-file").write_text("not a store\n", encoding="utf-8")
    process, log = _make_run(tmp_path, triton_cache, "--store", given)

    code = process.wait(STOP_TIMEOUT)

    [line] = _log(log).splitlines()
    assert code == 2
    assert line.startswith("error: STORE")
    assert said in line
    assert "s3://bucket/prefix" in line
    assert "hunter2" not in line
    assert not (tmp_path / ".state" / "triton.log").exists()
