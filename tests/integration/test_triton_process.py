"""The residue audit against the real Triton: its processes, its stubs, what a model leaves.

Each scenario is the retire flow the daemon runs: snapshot while loaded, unload, wait until
UNAVAILABLE, remove the slot's dir, audit. The leaky model leaves a real process holding a
real file under its dir, and a real file in /dev/shm; `cleanup_leaks` removes both.

The edges of the scan use real processes too: holders of files and dirs, a mapper of shared
memory, exited and zombie children, and scans run from namespaces of their own (`unshare`),
where other processes are invisible or may not be read.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from controlplane.adapters.triton.process import (
    PYTHON_BACKEND_SHM_PREFIX,
    TritonProcess,
    descendants,
    find_triton,
    open_files_under,
    rss_bytes,
    segments_mapped_by,
    tree_rss_bytes,
)
from controlplane.adapters.triton.residue import audit, files_of, shm_segments, snapshot
from devtools.launcher import RunningTriton
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

    # A sidecar without shareProcessNamespace: a PID namespace of its own, and its own /proc.
    invisible = _python_in_namespaces(
        ["--pid", "--fork", "--mount-proc"],
        "import sys; from pathlib import Path;"
        "from controlplane.adapters.triton.process import find_triton;"
        "found = find_triton(Path(sys.argv[1])); print(found.process, found.skipped)",
        str(triton.repository),
    )
    assert invisible.startswith("None no tritonserver process visible"), invisible
    assert "shareProcessNamespace: true" in invisible


def _python_in_namespaces(flags: list[str], code: str, *args: str) -> str:
    """What `python -c code args` prints from a user namespace of its own (and `flags`'s).

    In its own user namespace a process may not look into the fds, cwd, root or maps of the
    processes outside it (a sidecar running as another user would not either). Mapped to root
    in there, it still reads this venv; and so it works for root and, where user namespaces
    are allowed, for others.
    """
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", *flags, sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


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
    zombie = _zombie()
    try:
        assert rss_bytes(zombie.pid) is None  # its memory reads as zeros: it has none
    finally:
        zombie.wait()


# Holds each absolute path in its argv open (files and dirs alike) and a socket, then waits.
_HOLDER = """
import os, socket, sys, time
held = [os.open(arg, os.O_RDONLY) for arg in sys.argv[1:] if os.path.isabs(arg)]
peer = socket.socket()
print("ready", flush=True)
time.sleep(600)
"""


@contextmanager
def _holder(
    *args: str | Path,
    stdin: Path = Path(os.devnull),
    name: str = sys.executable,
    cwd: Path = Path(),
) -> Iterator[subprocess.Popen[str]]:
    """A real process named `name` (argv[0]) with `stdin` as fd 0, that holds `args` open
    until the block ends."""
    with stdin.open("rb") as fd0:
        process = subprocess.Popen(
            [name, "-c", _HOLDER, *map(str, args)],
            executable=sys.executable,
            stdin=fd0,
            stdout=subprocess.PIPE,
            text=True,
            cwd=cwd,
        )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "ready\n"
        yield process
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def _zombie() -> subprocess.Popen[bytes]:
    """A child that has exited and is not reaped yet: `wait()` it when done."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited; still in the table
    return child


def test_open_files_under_reads_links_and_skips_what_vanished(tmp_path: Path) -> None:
    """Real processes: exact prefix match, `(deleted)` targets and dirs (which psutil's
    open_files() leaves out), processes that exited, never the calling process."""
    slot, sibling = tmp_path / "m", tmp_path / "m2"
    (slot / "1").mkdir(parents=True)
    (sibling / "1").mkdir(parents=True)
    held = slot / "1" / "held.txt"
    held.write_text("held\n")
    (sibling / "1" / "model.py").write_text("")  # a sibling dir, not under .../m
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    zombie = _zombie()
    try:
        with (
            _holder(sibling / "1" / "model.py", slot / "1", stdin=held) as holder,
            (slot / "1" / "mine.txt").open("w"),  # the calling process: never reported
        ):
            held.unlink()
            found = open_files_under(slot)
            assert [(f.pid, f.target) for f in found] == [
                (holder.pid, f"{held} (deleted)"),
                (holder.pid, str(slot / "1")),
            ]
            assert (found[0].fd, found[0].path, found[0].deleted) == (0, str(held), True)
            assert "time.sleep(600)" in found[0].command
            some = open_files_under(slot, pids=[dead.pid, zombie.pid, os.getpid(), holder.pid])
            assert some == found
    finally:
        zombie.wait()


def test_a_file_of_a_dir_renamed_away_and_removed_is_found_by_inode(tmp_path: Path) -> None:
    """How the daemon removes a slot: rename it away, then delete; the holder's link names
    the new path, so only the inodes taken before tie it to the slot."""
    slot = tmp_path / "m"
    (slot / "1").mkdir(parents=True)
    held = slot / "1" / "held.txt"
    held.write_text("held\n")
    inodes = files_of(slot)
    with _holder(stdin=held) as holder:
        retired = slot.rename(tmp_path / "m.retired")
        shutil.rmtree(retired)
        assert open_files_under(slot, pids=[holder.pid]) == []
        [found] = open_files_under(slot, pids=[holder.pid], inodes=inodes)
        assert (found.fd, found.target) == (0, f"{retired}/1/held.txt (deleted)")


def test_shared_memory_a_process_maps_is_named_after_its_file_is_removed() -> None:
    prefix = f"controlplane-test-maps-{os.getpid()}-"
    segment = Path("/dev/shm") / f"{prefix}a"
    decoy = segment.with_name(f"{segment.name} (deleted)")
    segment.write_bytes(b"\0" * 4096)
    code = (
        "import mmap, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR);"
        "m = mmap.mmap(fd, 4096); os.close(fd); print('ready', flush=True); time.sleep(600)"
    )
    mapper = subprocess.Popen(
        [sys.executable, "-c", code, str(segment)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert mapper.stdout is not None
        assert mapper.stdout.readline() == "ready\n"
        assert segments_mapped_by([mapper.pid], prefix=prefix) == {segment.name}
        segment.unlink()  # what a killed stub leaves mapped, until it exits
        assert segments_mapped_by([mapper.pid], prefix=prefix) == {segment.name}
        # psutil keeps ' (deleted)' on a path when a file of that very name exists.
        decoy.write_bytes(b"")
        assert segments_mapped_by([mapper.pid], prefix=prefix) == {segment.name}
        assert segments_mapped_by([mapper.pid], prefix=prefix + "b") == set()
        denied = _python_in_namespaces(  # may not read its maps: skipped, nothing raised
            [],
            "import sys; from controlplane.adapters.triton.process import segments_mapped_by;"
            "print(segments_mapped_by([int(sys.argv[1])], prefix=sys.argv[2]))",
            str(mapper.pid),
            prefix,
        )
        assert denied == "set()"
    finally:
        mapper.kill()
        mapper.wait()
        if mapper.stdout is not None:
            mapper.stdout.close()
        segment.unlink(missing_ok=True)
        decoy.unlink(missing_ok=True)


def test_a_relative_model_repository_is_resolved_from_the_servers_cwd(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    repository.mkdir()
    with _holder("--model-repository", "repository", name="tritonserver", cwd=tmp_path) as server:
        found = find_triton(repository)
        assert found.process is not None, found.skipped
        assert (found.process.pid, found.process.repository) == (server.pid, repository)


def test_a_scan_that_may_not_look_skips_what_it_cannot_read(tmp_path: Path) -> None:
    """From a user namespace of its own, the fd links, cwd, root and maps of the processes
    outside it are denied: those processes are skipped, and nothing raises."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "held.txt").write_text("held\n")
    repository = tmp_path / "repository"
    repository.mkdir()
    with (
        _holder(tmp_path / "m" / "held.txt") as holder,
        _holder("--model-repository", "repository", name="tritonserver", cwd=tmp_path) as server,
    ):
        assert [f.pid for f in open_files_under(tmp_path / "m")] == [holder.pid]
        seen = _python_in_namespaces(
            [],
            "import sys; from pathlib import Path; from controlplane.adapters.triton.process"
            " import find_triton, open_files_under, rss_bytes;"
            "print(open_files_under(Path(sys.argv[1])), rss_bytes(int(sys.argv[3])) is None);"
            "print(find_triton(Path(sys.argv[2])).skipped)",
            str(tmp_path / "m"),
            str(repository),
            str(holder.pid),
        )
    denied, skipped = seen.splitlines()
    assert denied == "[] False"  # its RSS is not denied (statm is world-readable)
    assert "tritonserver visible (pids " in skipped
    assert str(server.pid) in skipped
    assert f"but none serves {repository}" in skipped
