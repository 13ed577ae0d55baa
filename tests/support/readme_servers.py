"""The README's long-running commands, started for real, checked ready, and stopped as a
person would: ``make run`` (Ctrl-C), ``tritonserver ...`` and ``controlplane serve`` (SIGTERM).

A command arrives with the README's fixed paths and addresses already replaced by the test's
(see ``tests/integration/test_readme.py``). Each server is started the way ``make run`` and the
test fixtures start it: ``make run`` is its recipe, ``python -m devtools.devrun``, in a
scratch dir of its own (``.state/`` lands there, and the checkout is on ``PYTHONPATH`` as the
checkout's root is for ``make run``); ``tritonserver`` is the bundled one, through
the launcher, with the README's flags passed last so they win; ``controlplane serve`` is the
venv's command with the block's exports.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from devtools.launcher import RunningTriton, free_port, launch_triton
from tests.support.polling import eventually

VENV_BIN = Path(sys.executable).parent
CHECKOUT = Path(__file__).resolve().parents[2]  # devtools/ lives here, not in the venv
START_TIMEOUT = 120.0
STOP_TIMEOUT = 30.0
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def split_command(text: str) -> tuple[dict[str, str], list[str]]:
    """`A=1 B=2 prog args` -> ({A: 1, B: 2}, [prog, args]), as the shell reads it."""
    words = shlex.split(text.replace("\\\n", " "), comments=True)
    env: dict[str, str] = {}
    while words and _ASSIGNMENT.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


def is_server(text: str) -> bool:
    """Whether the command starts a server that runs until it is stopped."""
    _env, words = split_command(text)
    return (
        words[:2] == ["make", "run"]
        or words[:1] == ["tritonserver"]
        or words[:2] == ["controlplane", "serve"]
    )


def exports(text: str) -> dict[str, str]:
    """`export NAME=VALUE` -> {NAME: VALUE}; raises on any other command."""
    words = shlex.split(text, comments=True)
    if len(words) != 2 or words[0] != "export" or not _ASSIGNMENT.match(words[1]):
        raise ValueError(f"not a plain 'export NAME=VALUE': {text!r}")
    name, _, value = words[1].partition("=")
    return {name: value}


@dataclass
class Servers:
    """Every server one README section started, stopped in reverse order by :meth:`stop_all`."""

    scratch: Path
    triton_cache: Path
    monkeypatch: pytest.MonkeyPatch
    tritons: list[RunningTriton] = field(default_factory=list)
    processes: list[tuple[str, subprocess.Popen[bytes], Path]] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)

    def start(self, text: str, exported: Mapping[str, str]) -> None:
        env, words = split_command(text)
        if words[:2] == ["make", "run"]:
            self._make_run()
        elif words[0] == "tritonserver":
            self._tritonserver(env, [w for w in words[1:] if w != "..."])
        else:
            self._serve({**exported, **env}, words[2:])

    # --- make run: Ctrl-C stops both --------------------------------------------------

    def _make_run(self) -> None:
        cwd = self.scratch / "make-run"
        (cwd / ".state").mkdir(parents=True)
        # The server tree the launcher prepares is reused from the tests' cache, not copied.
        (cwd / ".state" / "triton-cache").symlink_to(self.triton_cache)
        log = cwd / "make-run.log"
        python_path = [str(CHECKOUT), *filter(None, [os.environ.get("PYTHONPATH")])]
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "devtools.devrun"],
                cwd=cwd,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(python_path)},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: the Ctrl-C below reaches it alone
            )
        self.processes.append(("make run", process, log))
        eventually(
            lambda: process.poll() is not None or "controlplane is running" in _read(log),
            START_TIMEOUT,
            "make run printing its guide",
        )
        assert process.poll() is None, f"make run exited early:\n{_read(log)}"

    def _stop_make_run(self, process: subprocess.Popen[bytes], log: Path) -> None:
        guide = _read(log)
        addresses = re.findall(r"Triton\s+HTTP (\S+)|daemon\s+(http://\S+)", guide)
        urls = [url for pair in addresses for url in pair if url]
        assert len(urls) == 2, f"make run's guide names no Triton or daemon:\n{guide}"
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in its terminal sends
        assert process.wait(STOP_TIMEOUT) == 0, _read(log)
        for url in urls:  # "Ctrl-C stops both": neither answers any more
            with pytest.raises(httpx.TransportError):
                httpx.get(url, timeout=2.0)

    # --- tritonserver -----------------------------------------------------------------

    def _tritonserver(self, env: Mapping[str, str], args: list[str]) -> None:
        given = [a.split("=", 1)[1] for a in args if a.startswith("--model-repository=")]
        repository = Path(given[-1]) if given else self.scratch / f"repository-{len(self.tritons)}"
        repository.mkdir(parents=True, exist_ok=True)  # as the README's init container does
        with self.monkeypatch.context() as patch:
            for name, value in env.items():  # e.g. LD_PRELOAD, for this process only
                patch.setenv(name, value)
            triton = launch_triton(
                repository,
                cache_dir=self.triton_cache,
                extra_args=args,
                log_path=self.scratch / f"triton-{len(self.tritons)}.log",
            )
        self.tritons.append(triton)
        ready = httpx.get(f"{triton.http_url}/v2/health/ready", timeout=5.0)
        assert ready.status_code == 200, f"Triton is live but not ready: {triton.log_tail()}"
        maps = Path(f"/proc/{triton.pid}/maps").read_text(encoding="utf-8")
        for library in env.get("LD_PRELOAD", "").split():
            # ld.so only warns about a preload it cannot find, and Triton runs without it.
            assert str(Path(library).resolve()) in maps, f"{library} is not loaded in Triton"

    @property
    def triton(self) -> RunningTriton:
        assert self.tritons, "no tritonserver was started before this command"
        return self.tritons[-1]

    # --- controlplane serve -----------------------------------------------------------

    def _serve(self, env: Mapping[str, str], args: list[str]) -> None:
        port = free_port()
        full = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
        full.update(env)
        full["CONTROLPLANE_API__PORT"] = str(port)  # the README's default 8080, made free
        if self.tritons:  # Triton's default metrics port 8002 -> the started one's
            full.setdefault("CONTROLPLANE_TRITON__METRICS_URL", self.triton.metrics_url)
        log = self.scratch / f"serve-{port}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(VENV_BIN / "controlplane"), "serve", *args],
                env=full,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.processes.append(("controlplane serve", process, log))
        url = f"http://127.0.0.1:{port}/readyz"
        eventually(
            lambda: process.poll() is not None or _answers(url),
            START_TIMEOUT,
            "controlplane serve answering /readyz with 200",
        )
        assert process.poll() is None, f"controlplane serve exited early:\n{_read(log)}"

    # --- the end of the section -------------------------------------------------------

    def stop_all(self) -> None:
        """Stop every server, newest first, and check each stopped as the README says."""
        for name, process, log in reversed(self.processes):
            if name == "make run":
                self._stop_make_run(process, log)
            else:
                process.send_signal(signal.SIGTERM)
                code = process.wait(STOP_TIMEOUT)
                # uvicorn shuts down cleanly, then raises the signal again to end the process.
                assert code in (0, -signal.SIGTERM), f"{name} ended with {code}:\n{_read(log)}"
                assert "Application shutdown complete" in _read(log), _read(log)
            self.stopped.append(name)
        for triton in reversed(self.tritons):
            triton.stop()
            self.stopped.append("tritonserver")

    def kill_leftovers(self) -> None:
        """Teardown after a failure: nothing started here outlives the test."""
        for name, process, _log in self.processes:
            if process.poll() is not None:
                continue
            # make run stops its own children on Ctrl-C; a SIGKILL would orphan them.
            if name == "make run":
                os.killpg(process.pid, signal.SIGINT)
            else:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for triton in self.tritons:
            triton.stop()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.TransportError:
        return False


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""


@contextlib.contextmanager
def servers(
    scratch: Path, triton_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Servers]:
    running = Servers(scratch, triton_cache, monkeypatch)
    try:
        yield running
    finally:
        running.kill_leftovers()
