"""The ``controlplane`` command itself, with no daemon: its version, its shell completion, and
usage that is refused before any call.

Each case runs the real command in a subprocess, as a shell would."""

from __future__ import annotations

import os
import platform
import re
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest

from controlplane.cli.client import api_path
from devtools.launcher import free_port

EXIT_USAGE = 2
VENV_BIN = Path(sys.executable).parent  # where `make install` put the `controlplane` script


def controlplane(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CONTROLPLANE_", "_"))}
    return subprocess.run(
        [sys.executable, "-m", "controlplane", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_the_version_names_the_package_the_api_and_python(flag: str) -> None:
    result = controlplane(flag)

    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        f"controlplane {version('controlplane')} (API v1, Python {platform.python_version()})\n"
    )


@pytest.mark.parametrize(
    ("shell", "says"),
    [
        ("bash", "complete -o default -F _controlplane_completion controlplane"),
        ("zsh", "#compdef controlplane"),
        ("fish", "complete --command controlplane"),
    ],
)
def test_show_completion_prints_the_script_of_the_shell_named(shell: str, says: str) -> None:
    result = controlplane("--show-completion", shell)

    assert result.returncode == 0, result.stderr
    assert says in result.stdout
    assert "_CONTROLPLANE_COMPLETE=complete_" + shell in result.stdout


def test_bash_completes_commands_and_option_values_with_the_script() -> None:
    script = """
        source <(controlplane --show-completion bash)
        complete_words() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1));
                           _controlplane_completion controlplane; echo "${COMPREPLY[*]}"; }
        complete_words controlplane sta
        complete_words controlplane hi
        complete_words controlplane status --output ''
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTROLPLANE_", "_"))}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["status", "history", "table json yaml"]


def test_wait_is_a_plain_flag() -> None:
    unreachable = f"http://127.0.0.1:{free_port()}"  # a call would exit 3, not 2

    result = controlplane("deploy", "m", "r1", "--wait=true", "--url", unreachable)

    assert result.returncode == EXIT_USAGE
    assert "does not take a value" in result.stderr


def test_fleet_without_wait_is_refused_before_any_call() -> None:
    unreachable = f"http://127.0.0.1:{free_port()}"

    result = controlplane("deploy", "m", "r1", "--fleet", "--url", unreachable)

    assert result.returncode == EXIT_USAGE
    assert "use it with --wait" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("name", ["zz/../m", "m/..", "../m", "m/", "m?x=1", "a__blue", "é"])
def test_a_model_name_the_api_would_refuse_is_refused_before_any_call(name: str) -> None:
    unreachable = f"http://127.0.0.1:{free_port()}"

    result = controlplane("deploy", name, "r1", "--url", unreachable)

    assert result.returncode == EXIT_USAGE, result.stderr
    assert "invalid_name: model name" in _said(result.stderr)
    assert "cannot reach" not in result.stderr


def test_names_from_a_user_are_one_segment_each_in_the_apis_path() -> None:
    assert api_path("v1", "models", "zz/../m", "deploy") == "/v1/models/zz%2F..%2Fm/deploy"
    assert api_path("v1", "operations", model="a&limit=1", limit=5) == (
        "/v1/operations?model=a%26limit%3D1&limit=5"
    )
    assert api_path("v1", "operations", model=None, limit=5) == "/v1/operations?limit=5"
    # Dots alone are dot segments to an HTTP client (it would drop them): encoded instead.
    assert api_path("v1", "operations", "..") == "/v1/operations/%2E%2E"
    assert api_path("v1", "operations", ".") == "/v1/operations/%2E"


@pytest.mark.parametrize("url", ["notaurl", "127.0.0.1:8080", "ftp://cp:8080", "http://"])
def test_an_address_that_is_not_the_apis_is_bad_usage_not_an_unreachable_daemon(url: str) -> None:
    for output in ("table", "json"):
        result = controlplane("status", "-o", output, "--url", url)

        assert result.returncode == EXIT_USAGE, result.stderr
        assert "is not an address of the API: give http://HOST:PORT" in _said(result.stderr)
        assert result.stdout == ""


def test_an_address_from_the_environment_is_checked_the_same_way() -> None:
    result = controlplane("status", CONTROLPLANE_URL="cp:8080")

    assert result.returncode == EXIT_USAGE
    assert "'cp:8080' is not an address of the API" in _said(result.stderr)


def _said(stderr: str) -> str:
    """The words of a usage error, out of the box click draws around it (wrapped to 80)."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", stderr).split())


def test_watch_ends_once_its_reader_is_gone_even_when_nothing_changes() -> None:
    """``status --watch | head -1``: with a view that never changes (an unreachable daemon),
    nothing more is written, yet the watch ends at its next look."""
    unreachable = f"http://127.0.0.1:{free_port()}"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CONTROLPLANE_", "_"))}
    command = ["status", "--watch", "--interval", "0.2", "--url", unreachable]
    watching = subprocess.Popen(
        [sys.executable, "-m", "controlplane", *command],
        env=clean,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert watching.stdout is not None
        assert watching.stdout.readline().startswith("--- ")
        watching.stdout.close()  # as head does once it has its line
        assert watching.wait(timeout=10) == 0
    finally:
        watching.kill()
        watching.wait()


def test_watch_ends_0_on_two_interrupts_at_once() -> None:
    """`timeout -s INT` signals the command, then its whole process group: two SIGINTs, the
    second while the watch ends. Both together must still end it 0, not 130."""
    unreachable = f"http://127.0.0.1:{free_port()}"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CONTROLPLANE_", "_"))}
    command = ["status", "--watch", "--interval", "0.2", "--url", unreachable]
    for pause in (0.0, 0.001, 0.01):
        watching = subprocess.Popen(
            [sys.executable, "-m", "controlplane", *command],
            env=clean,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert watching.stdout is not None
            assert watching.stdout.readline().startswith("--- ")  # it watches
            watching.send_signal(signal.SIGINT)
            time.sleep(pause)  # the second lands at a different point of the exit each time
            watching.send_signal(signal.SIGINT)
            assert watching.wait(timeout=10) == 0, pause
        finally:
            watching.kill()
            watching.wait()
            if watching.stdout is not None:
                watching.stdout.close()
