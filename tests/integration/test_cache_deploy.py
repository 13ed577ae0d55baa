"""The content cache with the real local store and the real Triton: what a hit trusts.

A cache entry is named by a hash, but the name alone is not believed: a file the store lists
with another size is fetched (and refused when it does not match ``SHA256SUMS``), and an entry
whose bytes changed on disk is hashed again, deleted and fetched from the store. Both were
found by a tester: the cache served bytes that were not the release's.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory
from tests.support.daemon import Daemon
from tests.support.inference import infer_once
from tests.support.models import write_scale_release, write_sha256sums
from tests.support.tree import snapshot

pytestmark = pytest.mark.triton
INPLACE = "model_defaults:\n  strategy: inplace\n"


def _fetch_detail(daemon: Daemon, response: httpx.Response) -> dict[str, Any]:
    """The fetch step's detail of the operation a deploy answered with (refused or not)."""
    body = response.json()
    operation_id = body["operation"]["id"] if "operation" in body else body["operation_id"]
    operation = daemon.get(f"/v1/operations/{operation_id}").json()
    steps = operation["operation"]["steps"]
    return dict(next(s for s in steps if s["name"] == "fetch")["detail"])


def test_a_file_edited_after_sha256sums_is_refused_even_when_the_cache_holds_its_hash(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    # r2's SHA256SUMS lists r1's model.py; the publisher then edited model.py (another size).
    # The cache held the listed hash, and r2 used to "succeed" serving r1's bytes, while a
    # host without that entry refused it.
    write_scale_release(store, model_name, "r1", k=1.0)
    write_scale_release(store, model_name, "r2", k=1.0)
    model_py = store / model_name / "r2" / "1" / "model.py"
    model_py.write_text(model_py.read_text().replace("K = 1.0", "K = 20.0"))
    daemon = daemons(store, config=INPLACE)
    assert daemon.deploy(model_name, "r1").status_code == 200
    before = snapshot(daemon.repository / model_name)

    response = daemon.deploy(model_name, "r2")

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "checksum_mismatch"
    assert "1/model.py" in error["message"]
    detail = _fetch_detail(daemon, response)
    assert detail["files_cached"] == 1  # config.pbtxt: the size the store lists
    assert detail["files_cache_refused"] == 1
    assert snapshot(daemon.repository / model_name) == before
    assert infer_once(triton.grpc_url, model_name) == 1.0
    assert daemon.get(f"/v1/models/{model_name}").json()["active_release"] == "r1"
    assert daemon.staging_leftovers() == []


def test_a_cache_entry_changed_on_disk_is_not_served(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)
    daemon = daemons(store, config=INPLACE)
    assert daemon.deploy(model_name, "r1").status_code == 200
    published = (store / model_name / "r1" / "1" / "model.py").read_bytes()
    digest = hashlib.sha256(published).hexdigest()
    entry = daemon.staging / "cas" / digest
    # What `sed -i 's/K = 1.0/K = 9.0/'` does to the entry: a new inode, the same size.
    tampered = entry.with_name(".sed-tmp")
    tampered.write_bytes(published.replace(b"K = 1.0", b"K = 9.0"))
    os.replace(tampered, entry)
    # r2 lists r1's model.py (same hash) and one more file, so it is a release of its own.
    release = write_scale_release(store, model_name, "r2", k=1.0)
    (release / "1" / "notes.txt").write_text("r2\n", encoding="utf-8")
    write_sha256sums(release)

    response = daemon.deploy(model_name, "r2")

    assert response.status_code == 200, response.text
    assert infer_once(triton.grpc_url, model_name) == 1.0  # the store's bytes, not the entry's
    assert (daemon.repository / model_name / "1" / "model.py").read_bytes() == published
    assert entry.read_bytes() == published  # the verified download took the entry's place
    detail = _fetch_detail(daemon, response)
    assert detail["files_cached"] == 1  # config.pbtxt
    assert detail["files_cache_refused"] == 1
    assert digest in daemon.log()  # the warning names the deleted entry


def test_a_file_edited_to_the_same_size_gets_one_verdict_from_a_warm_and_an_empty_cache(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    # Found from outside: r2's SHA256SUMS lists r1's model.py, then model.py was edited to
    # the same size. The member whose cache held the listed hash deployed r2 (serving the
    # cached bytes, not the store's); a fresh member refused it. Now both refuse it: a hit
    # needs the store to vouch for the bytes (a version seen to hold them, or a read).
    write_scale_release(store, model_name, "r1", k=1.0)
    write_scale_release(store, model_name, "r2", k=1.0)
    model_py = store / model_name / "r2" / "1" / "model.py"
    edited = model_py.read_bytes().replace(b"K = 1.0", b"K = 9.0")
    assert len(edited) == model_py.stat().st_size
    model_py.write_bytes(edited)
    warm = daemons(store, config=INPLACE)
    assert warm.deploy(model_name, "r1").status_code == 200

    on_warm = warm.deploy(model_name, "r2")

    assert on_warm.status_code == 422, on_warm.text
    assert on_warm.json()["error"]["code"] == "checksum_mismatch"
    assert "1/model.py" in on_warm.json()["error"]["message"]
    detail = _fetch_detail(warm, on_warm)
    assert detail["files_cached"] == 1  # config.pbtxt: read in the store, the entry's bytes
    assert detail["files_cache_refused"] == 1
    assert infer_once(triton.grpc_url, model_name) == 1.0
    # An unchanged file shared across releases, written anew, is still linked from the cache.
    r3 = write_scale_release(store, model_name, "r3", k=1.0)
    (r3 / "1" / "notes.txt").write_text("r3\n", encoding="utf-8")
    write_sha256sums(r3)
    shared = warm.deploy(model_name, "r3")
    assert shared.status_code == 200, shared.text
    detail = shared.json()["operation"]["steps"][1]["detail"]
    assert detail["files_cached"] == 2  # config.pbtxt and 1/model.py
    assert detail["bytes_fetched"] == 3 + (r3 / "SHA256SUMS").stat().st_size  # notes.txt
    warm.stop()

    # Another host: its own staging and nothing cached (out of the fleet, so that it does
    # not first converge to what the warm one serves, which would fill its cache).
    empty = daemons(store, config=INPLACE + "fleet:\n  enabled: false\n")
    on_empty = empty.deploy(model_name, "r2")

    assert on_empty.status_code == on_warm.status_code
    assert on_empty.json()["error"]["code"] == on_warm.json()["error"]["code"]
    assert "1/model.py" in on_empty.json()["error"]["message"]
    assert _fetch_detail(empty, on_empty)["files_cached"] == 0
