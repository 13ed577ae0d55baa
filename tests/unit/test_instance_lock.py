"""The instance lock: all places or none, the holder named in a refusal, files that stay.

``flock`` locks belong to an open file description, so two acquisitions in this one process
contend exactly as two daemons would. The kill-and-restart case needs a real process and is in
tests/integration/test_instance_lock.py.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from controlplane.adapters.instance_lock import (
    LOCK_NAME,
    InstanceLock,
    InstanceLockError,
    Place,
    StateInUse,
    places,
)

API = "http://127.0.0.1:8080"


def state(root: Path, *, repository: str = "repository", database: str = "cp.db") -> list[Place]:
    return places(repository=root / repository, staging=root / "staging", database=root / database)


def test_a_second_holder_is_refused_with_the_first_named(tmp_path: Path) -> None:
    with InstanceLock.acquire(state(tmp_path), api=API):
        with pytest.raises(StateInUse) as refused:
            InstanceLock.acquire(state(tmp_path), api="http://127.0.0.1:9999")

        message = str(refused.value)
        assert f"the repository {tmp_path / 'repository'} is in use" in message
        assert f"pid {os.getpid()} on host {socket.gethostname()}, started " in message
        assert f"API {API}" in message
        assert f"lock file: {tmp_path / 'repository' / LOCK_NAME}" in message
        assert "repository.path of its own" in message


def test_the_files_sit_in_the_repository_and_staging_and_beside_the_database(
    tmp_path: Path,
) -> None:
    with InstanceLock.acquire(state(tmp_path), api=API) as lock:
        assert lock.files == [
            tmp_path / "repository" / LOCK_NAME,
            tmp_path / "staging" / LOCK_NAME,
            tmp_path / "cp.db.lock",
        ]
        for path in lock.files:
            holder = json.loads(path.read_text(encoding="utf-8"))
            assert holder["pid"] == os.getpid()
            assert holder["api"] == API


def test_a_refusal_releases_what_was_already_taken(tmp_path: Path) -> None:
    database_only = [state(tmp_path)[2]]
    with InstanceLock.acquire(database_only, api=API):
        # Another repository and staging dir, the same database: refused on the database...
        with pytest.raises(StateInUse, match=r"the database .* is in use"):
            InstanceLock.acquire(state(tmp_path, repository="other"), api=API)
        # ...and the repository and staging locks it took on the way were given back.
        InstanceLock.acquire(state(tmp_path, repository="other")[:2], api=API).release()


def test_released_locks_can_be_taken_again_and_the_files_stay(tmp_path: Path) -> None:
    first = InstanceLock.acquire(state(tmp_path), api=API)
    files = first.files
    first.release()

    assert all(path.is_file() for path in files)
    InstanceLock.acquire(state(tmp_path), api="http://127.0.0.1:9999").release()
    holder = json.loads(files[0].read_text(encoding="utf-8"))
    assert holder["api"] == "http://127.0.0.1:9999"


def test_a_holder_that_has_not_signed_yet_is_still_refused_with_a_clear_line(
    tmp_path: Path,
) -> None:
    with InstanceLock.acquire(state(tmp_path), api=API) as lock:
        lock.files[0].write_text("", encoding="utf-8")  # as between its flock and its write

        with pytest.raises(StateInUse, match="it has not written who it is yet"):
            InstanceLock.acquire(state(tmp_path), api=API)


def test_a_lock_file_that_cannot_be_created_says_where_and_why(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the database's dir should be", encoding="utf-8")
    place = places(
        repository=tmp_path / "repository",
        staging=tmp_path / "staging",
        database=blocker / "cp.db",
    )

    with pytest.raises(InstanceLockError, match=r"cannot open the lock file .*cp\.db\.lock"):
        InstanceLock.acquire(place, api=API)
    InstanceLock.acquire(place[:2], api=API).release()  # nothing was left held
