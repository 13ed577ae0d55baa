"""The residue audit and the leak trend against the real Triton, with a model that leaks on
purpose (a detached process holding a file of its dir, shared memory left on every load)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory
from tests.integration.test_metrics import scrape, value
from tests.support.daemon import Daemon
from tests.support.models import (
    cleanup_leaks,
    leak_holders,
    write_leaky_release,
    write_scale_release,
)
from tests.support.polling import eventually

pytestmark = pytest.mark.triton

MIB = 1024**2


@pytest.fixture
def leaky(model_name: str) -> Iterator[str]:
    yield model_name
    cleanup_leaks(model_name)


def _config(model: str, *, retire_after: float, **memory: int) -> str:
    lines = [f"models:\n  {model}:\n    retire_after_seconds: {retire_after}"]
    if memory:
        lines.append("memory:")
        lines += [f"  {key}: {value}" for key, value in memory.items()]
    return "\n".join(lines) + "\n"


def _deploy(daemon: Daemon, model: str, release: str) -> None:
    response = daemon.deploy(model, release)
    assert response.status_code == 200, response.text


def test_the_audit_names_what_a_leaking_model_left_and_passes_a_clean_one(
    daemons: DaemonFactory, store: Path, leaky: str, triton: RunningTriton
) -> None:
    model = leaky
    write_leaky_release(store, model, "r1", leak_bytes=4 * MIB)
    write_scale_release(store, model, "r2", k=2.0)
    write_scale_release(store, model, "r3", k=3.0)
    daemon = daemons(store, config=_config(model, retire_after=0))
    blue, green = f"{model}__blue", f"{model}__green"

    _deploy(daemon, model, "r1")  # blue, leaky
    _deploy(daemon, model, "r2")  # green; blue (r1) retires at once
    eventually(lambda: not (daemon.repository / blue).exists(), 60, "blue retired")
    first = _residue(daemon, model)

    assert first["clean"] is False, first
    holders = set(leak_holders(model))
    assert holders, "the leaky model's holder process is running"
    held = first["open_files"]
    assert {f["pid"] for f in held} <= holders
    assert held
    assert all(f["path"].endswith("held.txt (deleted)") for f in held)
    assert first["triton_pid"] == triton.process.pid
    assert first["triton_rss_before"] > 0
    findings = scrape(daemon)["controlplane_residue_findings"][1]
    assert value(findings, "controlplane_residue_findings_total", kind="open_files") >= 1

    _deploy(daemon, model, "r3")  # blue again; green (r2, clean) retires at once
    eventually(lambda: not (daemon.repository / green).exists(), 60, "green retired")
    second = _residue(daemon, model)

    assert second["clean"] is True, second
    assert second["open_files"] == []
    assert second["stubs_alive"] == []


def _residue(daemon: Daemon, model: str) -> dict[str, Any]:
    """The residue the newest retire of ``model`` reported, once it has finished."""
    found: dict[str, Any] = {}

    def reported() -> bool:
        operations = daemon.get(f"/v1/operations?model={model}&limit=1").json()["operations"]
        op = operations[0] if operations else None
        if op is None or op["kind"] != "retire" or op["status"] != "succeeded":
            return False
        unload = next(s for s in op["steps"] if s["name"] == "unload")
        found.update(unload["detail"]["residue"])
        return True

    eventually(reported, 60, "the retire's residue audit")
    return found


@pytest.mark.parametrize("leaks", [True, False], ids=["leaking", "clean"])
def test_memory_that_grows_with_every_swap_is_flagged(
    daemons: DaemonFactory, store: Path, leaky: str, triton: RunningTriton, leaks: bool
) -> None:
    model = leaky
    for n in range(1, 5):
        if leaks:
            write_leaky_release(store, model, f"r{n}", leak_bytes=64 * MIB, hold_file=False)
        else:
            write_scale_release(store, model, f"r{n}", k=float(n))
    config = _config(model, retire_after=600, leak_window_swaps=3, leak_threshold_bytes=48 * MIB)
    daemon = daemons(store, config=config)

    for n in range(1, 5):
        _deploy(daemon, model, f"r{n}")

    memory = daemon.get("/v1/memory").json()
    assert memory["audit"] == {"active": True, "skipped": None}
    assert len(memory["samples"]) == 3
    host = next(t for t in memory["trends"] if t["kind"] == "host")
    assert host["samples"] == 3
    assert host["leak_suspected"] is leaks, host
    growth = value(
        scrape(daemon)["controlplane_triton_memory_growth_bytes"][1],
        "controlplane_triton_memory_growth_bytes",
        kind="host",
    )
    assert growth == host["growth_bytes"]
    if leaks:
        assert growth >= 2 * 64 * MIB * 0.9
        assert "a leak is likely" in daemon.log()
    else:
        assert growth < 48 * MIB
        assert "a leak is likely" not in daemon.log()


def test_an_unload_audits_each_slot_it_frees(
    daemons: DaemonFactory, store: Path, model_name: str
) -> None:
    """``POST /v1/models/{m}/unload`` of a blue-green model with a warm previous slot: the
    alias goes first, then each slot in a step of its own that carries its residue audit."""
    model = model_name
    write_scale_release(store, model, "r1", k=1.0)
    write_scale_release(store, model, "r2", k=2.0)
    daemon = daemons(store, config=_config(model, retire_after=3600))
    _deploy(daemon, model, "r1")
    _deploy(daemon, model, "r2")  # r1 stays warm on blue

    answer = daemon.post(f"/v1/models/{model}/unload", {"wait": True})

    assert answer.status_code == 200, answer.text
    steps = answer.json()["operation"]["steps"]
    assert [s["name"] for s in steps] == ["unload", "unload", "unload", "record", "publish"]
    assert steps[0]["detail"]["alias"] == model
    freed = {s["detail"]["slot"]: s["detail"] for s in steps[1:3]}
    assert set(freed) == {f"{model}__blue", f"{model}__green"}
    for slot, detail in freed.items():
        residue = detail["residue"]
        assert residue["clean"] is True, (slot, residue)
    assert not (daemon.repository / f"{model}__blue").exists()
    assert not (daemon.repository / f"{model}__green").exists()
