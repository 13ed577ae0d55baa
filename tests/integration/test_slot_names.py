"""Slot names belong to their model, against the real daemon and Triton.

A blue-green model ``c`` has the Triton models ``c__blue`` and ``c__green``: no other model may
be called that (``__`` is reserved in model names), no deploy may replace a dir in the
repository that another model (or someone else) put there, and the name-length rule applies to
the name a user writes, not to the slot names the daemon derives from it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from controlplane.domain.names import MAX_NAME_LENGTH
from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory
from tests.support.inference import infer_once
from tests.support.models import write_scale_release
from tests.support.tree import snapshot

pytestmark = pytest.mark.triton


@pytest.mark.parametrize("suffix", ["__green", "__blue"])
def test_a_model_named_like_another_model_s_slot_is_refused(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton, suffix: str
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)
    taker = model_name + suffix
    write_scale_release(store, taker, "r1", k=9.0)
    daemon = daemons(store)
    assert daemon.deploy(model_name, "r1").status_code == 200

    refused = daemon.deploy(taker, "r1")

    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid_name"
    assert "reserved" in error["message"]
    assert infer_once(triton.grpc_url, model_name) == 1.0
    assert daemon.get(f"/v1/models/{model_name}").json()["active_release"] == "r1"


def test_a_deploy_never_replaces_a_dir_another_model_put_there(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)
    write_scale_release(store, model_name, "r2", k=2.0)
    daemon = daemons(store)
    assert daemon.deploy(model_name, "r1").status_code == 200  # on blue
    # Someone copies a model of their own where the green slot goes.
    foreign = daemon.repository / f"{model_name}__green"
    shutil.copytree(store / model_name / "r1", foreign)
    before = snapshot(foreign)

    refused = daemon.deploy(model_name, "r2")

    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "name_conflict"
    assert str(foreign.name) in error["message"]
    assert snapshot(foreign) == before
    assert infer_once(triton.grpc_url, model_name) == 1.0
    assert daemon.staging_leftovers() == []
    shutil.rmtree(foreign)
    assert daemon.deploy(model_name, "r2").status_code == 200


def test_a_model_name_of_the_documented_maximum_length_deploys(
    daemons: DaemonFactory, store: Path, triton: RunningTriton
) -> None:
    longest = ("long-" + "x" * MAX_NAME_LENGTH)[:MAX_NAME_LENGTH]
    write_scale_release(store, longest, "r1", k=4.0)
    daemon = daemons(store)

    response = daemon.deploy(longest, "r1")

    assert response.status_code == 200, response.text
    assert infer_once(triton.grpc_url, longest) == 4.0
    too_long = daemon.deploy(longest + "y", "r1")
    assert too_long.status_code == 400
    assert f"{MAX_NAME_LENGTH + 1} characters" in too_long.json()["error"]["message"]
