"""The residue audit against the real Triton: its processes, its stubs, what a model leaves.

Each scenario is the retire flow the daemon runs: snapshot while loaded, unload, wait until
UNAVAILABLE, remove the slot's dir, audit. The leaky model leaves a real process holding a
real file under its dir, and a real file in /dev/shm; `cleanup_leaks` removes both.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from controlplane.adapters.triton.launcher import RunningTriton
from controlplane.adapters.triton.process import (
    PYTHON_BACKEND_SHM_PREFIX,
    TritonProcess,
    audit,
    descendants,
    find_triton,
    open_files_under,
    rss_bytes,
    shm_segments,
    snapshot,
    tree_rss_bytes,
)
from tests.conftest import TritonFactory
from tests.support.models import (
    HELD_FILE,
    LEAK_PREFIX,
    cleanup_leaks,
    leak_files,
    leak_holders,
    write_leaky_release,
    write_scale_release,
)
from tests.support.polling import eventually

pytestmark = pytest.mark.triton

LEAK_BYTES = 4 * 1024 * 1024


@pytest.fixture
def http(triton: RunningTriton) -> Iterator[httpx.Client]:
    # trust_env=False: a proxy from the environment must not see loopback calls.
    with httpx.Client(base_url=triton.http_url, trust_env=False, timeout=60.0) as client:
        yield client


def _load(http: httpx.Client, model: str) -> None:
    response = http.post(f"/v2/repository/models/{model}/load")
    assert response.status_code == 200, response.text


def _state(http: httpx.Client, model: str) -> str | None:
    index = http.post("/v2/repository/index").json()
    return next((e.get("state") for e in index if e["name"] == model), None)


def _unload_and_remove(http: httpx.Client, model: str, slot_dir: Path) -> None:
    """What retiring does before the audit: unload, wait for UNAVAILABLE, remove the dir."""
    response = http.post(f"/v2/repository/models/{model}/unload")
    assert response.status_code == 200, response.text
    eventually(lambda: _state(http, model) == "UNAVAILABLE", 30, f"{model} UNAVAILABLE")
    shutil.rmtree(slot_dir)


def _triton(triton: RunningTriton) -> TritonProcess:
    lookup = find_triton(triton.repository)
    assert lookup.process is not None, lookup.skipped
    return lookup.process


def test_find_triton_by_repository_or_pid_and_say_why_not(
    triton: RunningTriton, tmp_path: Path
) -> None:
    found = find_triton(triton.repository)
    assert found.skipped is None
    assert found.process is not None
    assert found.process.pid == triton.pid
    assert found.process.repository == triton.repository
    assert find_triton(triton.repository, pid=triton.pid).process == found.process

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    # A configured pid that is gone falls back to the scan.
    assert find_triton(triton.repository, pid=dead.pid).process == found.process

    unused = tmp_path / "repository"
    unused.mkdir()
    nobody = find_triton(unused)
    assert nobody.process is None
    assert nobody.skipped is not None
    assert str(unused) in nobody.skipped
    assert str(triton.pid) in nobody.skipped  # the servers it did see

    empty_proc = tmp_path / "proc"
    empty_proc.mkdir()
    invisible = find_triton(triton.repository, proc_root=empty_proc)
    assert invisible.process is None
    assert invisible.skipped is not None
    assert "shareProcessNamespace: true" in invisible.skipped


def test_a_leaky_model_leaves_a_holder_of_its_file_and_shared_memory(
    triton: RunningTriton, http: httpx.Client, store: Path, model_name: str
) -> None:
    release = write_leaky_release(store, model_name, "r1", leak_bytes=LEAK_BYTES)
    slot_dir = triton.repository / model_name
    shutil.copytree(release, slot_dir)
    try:
        _load(http, model_name)
        process = _triton(triton)
        before = snapshot(process, slot_dir)
        [stub] = before.stubs
        assert stub.pid in descendants(triton.pid)
        assert stub.instance == f"{model_name}_0_0"
        assert stub.model_file == slot_dir / "1" / "model.py"
        [segment] = before.segments
        assert segment.name.startswith(PYTHON_BACKEND_SHM_PREFIX)
        assert segment.size > 0
        assert before.unseen_segments == ()
        [holder] = leak_holders(model_name)

        _unload_and_remove(http, model_name, slot_dir)
        residue = audit(before)

        assert not residue.clean
        held = [f for f in residue.open_files if f.pid == holder]
        assert [(f.fd, f.target) for f in held] == [(0, f"{slot_dir / HELD_FILE} (deleted)")]
        assert held[0].deleted
        assert "time.sleep(600)" in held[0].command
        assert f"pid {holder} fd 0" in residue.summary()
        assert residue.stubs_alive == ()
        assert residue.segments == ()  # the backend removed its own segment on unload
        [leaked] = leak_files(model_name).values()
        assert leaked == LEAK_BYTES
        assert LEAK_BYTES in shm_segments(prefix=LEAK_PREFIX + model_name).values()
    finally:
        cleanup_leaks(model_name)
        if slot_dir.exists():
            http.post(f"/v2/repository/models/{model_name}/unload")
            shutil.rmtree(slot_dir)
    assert open_files_under(slot_dir) == []
    assert leak_files(model_name) == {}
    assert leak_holders(model_name) == []


def test_a_clean_model_leaves_nothing(
    triton: RunningTriton, http: httpx.Client, store: Path, model_name: str
) -> None:
    release = write_scale_release(store, model_name, "r1", k=2.0)
    slot_dir = triton.repository / model_name
    shutil.copytree(release, slot_dir)
    try:
        _load(http, model_name)
        before = snapshot(_triton(triton), slot_dir)
        [stub] = before.stubs
        assert [s.name for s in before.segments] == list(stub.segments)
        assert before.main_rss_bytes is not None
        assert before.tree_rss_bytes is not None
        assert before.tree_rss_bytes > before.main_rss_bytes  # the stub counts in the tree

        _unload_and_remove(http, model_name, slot_dir)
        residue = audit(before)

        assert residue.open_files == ()
        assert residue.segments == ()
        assert residue.stubs_alive == ()
        assert residue.clean, residue.summary()
        assert residue.summary().startswith("clean")
        assert residue.tree_rss_after is not None
        assert residue.tree_rss_after < before.tree_rss_bytes  # the stub is gone
        assert stub.segments[0] not in shm_segments()
    finally:
        if slot_dir.exists():
            http.post(f"/v2/repository/models/{model_name}/unload")
            shutil.rmtree(slot_dir)


def test_segments_of_a_triton_killed_with_the_model_loaded_stay(
    own_triton: TritonFactory, store: Path, tmp_path: Path
) -> None:
    repository = tmp_path / "repository"
    repository.mkdir()
    own = own_triton(repository)
    shutil.copytree(write_scale_release(store, "m", "r1", k=1.0), repository / "m")
    with httpx.Client(base_url=own.http_url, trust_env=False, timeout=60.0) as client:
        _load(client, "m")
    process = _triton(own)
    before = snapshot(process, process.repository / "m")
    [stub] = before.stubs
    names = [s.name for s in before.segments]
    try:
        os.kill(own.pid, signal.SIGKILL)
        own.stop()  # reaps Triton and kills what is left of its process group
        eventually(lambda: rss_bytes(stub.pid) is None, 10, "the stub gone")
        residue = audit(before)
        assert [s.name for s in residue.segments] == names
        assert residue.main_rss_after is None  # Triton itself is gone
        assert not residue.clean
    finally:
        for name in names:
            (Path("/dev/shm") / name).unlink(missing_ok=True)


def test_rss_of_triton_and_of_a_dead_process(triton: RunningTriton) -> None:
    main = rss_bytes(triton.pid)
    tree = tree_rss_bytes(triton.pid)
    assert main is not None
    assert main > 1024 * 1024
    assert tree is not None
    assert tree >= main

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert rss_bytes(dead.pid) is None
    assert tree_rss_bytes(dead.pid) is None


def test_open_files_under_reads_links_and_skips_what_vanished(tmp_path: Path) -> None:
    """A fake /proc: exact prefix match, `(deleted)` targets, a process without an fd dir."""
    proc = tmp_path / "proc"
    fds = proc / "123" / "fd"
    fds.mkdir(parents=True)
    (proc / "123" / "cmdline").write_bytes(b"python3\0-c\0sleep\0")
    os.symlink("/repo/m/1/held.txt (deleted)", fds / "0")
    os.symlink("/repo/m2/1/model.py", fds / "3")  # a sibling dir, not under /repo/m
    os.symlink("socket:[4242]", fds / "4")
    (proc / "456").mkdir()  # exited between the listing and the read: no fd dir
    [found] = open_files_under(Path("/repo/m"), proc_root=proc)
    assert (found.pid, found.fd, found.path, found.deleted) == (123, 0, "/repo/m/1/held.txt", True)
    assert found.command == "python3 -c sleep"
