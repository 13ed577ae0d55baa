"""The daemon's log as people and collectors read it: one short line per event on a terminal,
one JSON object per line otherwise, and ``log.format`` to choose either way."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devtools.launcher import RunningTriton, free_port
from tests.integration.conftest import DaemonFactory
from tests.support.polling import eventually

pytestmark = pytest.mark.triton

# 12:04:05.123 INFO  starting  triton=127.0.0.1:8001 ...
TEXT_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO |WARN |ERROR|CRIT ) \S")


@contextlib.contextmanager
def daemon_on_a_terminal(tmp_path: Path, **settings: str) -> Iterator[Callable[[], list[str]]]:
    """``controlplane serve`` with its stdout and stderr on a pseudo-terminal, as ``make run``
    or a person starts it, with no Triton where it looks for one; yields a function that
    returns the lines it has written so far."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env.update(
        {
            "CONTROLPLANE_REPOSITORY__PATH": str(tmp_path / "root" / "repository"),
            "CONTROLPLANE_STORE__URI": (tmp_path / "store").as_uri(),
            "CONTROLPLANE_TRITON__GRPC_URL": f"127.0.0.1:{free_port()}",
            "CONTROLPLANE_API__PORT": str(free_port()),
            **settings,
        }
    )
    (tmp_path / "store").mkdir()
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "controlplane", "serve"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    output = bytearray()

    def lines() -> list[str]:
        while select.select([master], [], [], 0)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            output.extend(chunk)
        return output.decode(errors="replace").replace("\r\n", "\n").splitlines()

    try:
        yield lines
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        os.close(master)


def _until_triton_is_said_missing(lines: Callable[[], list[str]]) -> list[str]:
    eventually(
        lambda: any("cannot be reached (triton.grpc_url)" in line for line in lines()),
        60,
        "the line about Triton",
    )
    return lines()


def test_a_daemon_on_a_terminal_writes_one_short_line_per_event(tmp_path: Path) -> None:
    with daemon_on_a_terminal(tmp_path) as lines:
        seen = _until_triton_is_said_missing(lines)

    assert seen
    assert all(TEXT_LINE.match(line) for line in seen), seen
    starting = next(line for line in seen if " starting  " in line)
    assert "triton=127.0.0.1:" in starting
    assert "auth=false" in starting
    triton = next(line for line in seen if "cannot be reached" in line)
    assert " ERROR Triton at 127.0.0.1:" in triton


def test_no_password_of_a_url_setting_reaches_the_log(tmp_path: Path) -> None:
    """Every URL the daemon reads carries a password; none of its start-up lines, nor the
    Prometheus source's complaint that nothing answers there, repeats it."""
    nowhere = f"127.0.0.1:{free_port()}"
    with daemon_on_a_terminal(
        tmp_path,
        CONTROLPLANE_LOG__FORMAT="json",
        CONTROLPLANE_TRITON__METRICS_URL=f"http://scraper:hunter2@{nowhere}/metrics",
        CONTROLPLANE_MEMORY__GPU_METRICS_URL=f"http://gpu:hunter2@{nowhere}/metrics",
        CONTROLPLANE_ROLLBACK__SOURCE="prometheus",
        CONTROLPLANE_ROLLBACK__PROMETHEUS_URL=f"http://admin:hunter2@{nowhere}",
    ) as lines:
        eventually(
            lambda: any(f"Prometheus at http://{nowhere}: query" in line for line in lines()),
            60,
            "the line about Prometheus",
        )
        seen = _until_triton_is_said_missing(lines)

    assert any(json.loads(line)["message"] == "starting" for line in seen), seen
    assert not [line for line in seen if "hunter2" in line]


def test_on_a_terminal_json_can_still_be_asked_for(tmp_path: Path) -> None:
    with daemon_on_a_terminal(tmp_path, CONTROLPLANE_LOG__FORMAT="json") as lines:
        seen = _until_triton_is_said_missing(lines)

    assert [json.loads(line)["level"] for line in seen if "cannot be reached" in line] == ["error"]
    assert all(line.startswith("{") for line in seen), seen


def test_a_daemon_writing_to_a_file_logs_json_lines(daemons: DaemonFactory, store: Path) -> None:
    daemon = daemons(store)
    entries = [json.loads(line) for line in daemon.log().splitlines()]
    assert any(entry["message"] == "starting" for entry in entries)
    assert all({"time", "level", "logger", "message"} <= set(entry) for entry in entries)


def test_the_setting_writes_text_to_a_file_too(
    daemons: DaemonFactory, store: Path, triton: RunningTriton
) -> None:
    daemon = daemons(store, extra_env={"CONTROLPLANE_LOG__FORMAT": "text"})
    lines = daemon.log().splitlines()
    assert any(" starting  " in line for line in lines), lines
    assert all(TEXT_LINE.match(line) for line in lines), lines
    assert any(f"triton={triton.grpc_url}" in line for line in lines)
