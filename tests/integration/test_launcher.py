"""Self-check of the Triton launcher and the release helpers against the real server.

If these fail, every other integration test would fail for the same reason; they say so first.
"""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path

import httpx
import pytest

from devtools.launcher import RunningTriton
from tests.support.models import write_scale_release

pytestmark = pytest.mark.triton


def test_session_triton_is_live_and_lists_its_repository(triton: RunningTriton) -> None:
    with httpx.Client(trust_env=False, timeout=10.0) as client:
        live = client.get(f"{triton.http_url}/v2/health/live")
        index = client.post(f"{triton.http_url}/v2/repository/index", json={})

    assert live.status_code == 200
    assert index.status_code == 200
    assert isinstance(index.json(), list)


def test_scale_release_loads_infers_and_unloads(triton: RunningTriton, store: Path) -> None:
    name = f"scale_{uuid.uuid4().hex[:8]}"
    release = write_scale_release(store, "scale", "r1", k=2)
    slot = triton.repository / name
    shutil.copytree(release, slot)
    config = slot / "config.pbtxt"
    config.write_text(
        re.sub(r'^name: ".*"$', f'name: "{name}"', config.read_text(), count=1, flags=re.M),
        encoding="utf-8",
    )
    request = {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}

    with httpx.Client(trust_env=False, timeout=60.0) as client:
        load = client.post(f"{triton.http_url}/v2/repository/models/{name}/load")
        assert load.status_code == 200, load.text
        infer = client.post(f"{triton.http_url}/v2/models/{name}/infer", json=request)
        unload = client.post(f"{triton.http_url}/v2/repository/models/{name}/unload")

    assert infer.status_code == 200, infer.text
    (output,) = infer.json()["outputs"]
    assert output["name"] == "OUTPUT0"
    assert output["datatype"] == "FP32"
    assert output["data"] == [2.0, 4.0]
    assert unload.status_code == 200, unload.text
