"""`controlplane apply -f` and `diff -f` as a CI job or a GitOps sync hook runs them, against a
real daemon and the real Triton: the first apply deploys every model of the file, a second one
changes nothing, an edit changes that model alone, --dry-run changes nothing, and a release the
daemon refuses stops the apply with the model named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.launcher import RunningTriton
from tests.support.daemon import Daemon, start_daemon
from tests.support.inference import infer_once
from tests.support.models import write_scale_release

pytestmark = pytest.mark.triton
TOKEN = "apply-token"
EXIT_DIFFERS = 1


def cli(daemon: Daemon, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env.update({"CONTROLPLANE_URL": daemon.url, "CONTROLPLANE_TOKEN": TOKEN})
    return subprocess.run(
        [sys.executable, "-m", "controlplane", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def document(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(result.stdout)


def operations(daemon: Daemon, model: str) -> list[dict[str, Any]]:
    """``model``'s deploys, newest first (the housekeeping after each is left out)."""
    answer = daemon.get(f"/v1/operations?model={model}&limit=100")
    assert answer.status_code == 200, answer.text
    return [op for op in answer.json()["operations"] if op["kind"] == "deploy"]


def models_file(path: Path, releases: dict[str, str]) -> Path:
    lines = ["# the release each model serves", "models:"]
    lines += [f"  {model}: {release}" for model, release in releases.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def shared(
    triton: RunningTriton, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Daemon, Path]]:
    workdir = tmp_path_factory.mktemp("apply")
    store = workdir / "store"
    store.mkdir()
    daemon = start_daemon(triton=triton, store=store, workdir=workdir, token=TOKEN)
    try:
        yield daemon, store
    finally:
        daemon.stop()


def test_apply_deploys_what_changed_only_and_diff_says_what_would(
    shared: tuple[Daemon, Path], triton: RunningTriton, model_name: str, tmp_path: Path
) -> None:
    daemon, store = shared
    first, second = f"{model_name}-a", f"{model_name}-b"
    for model in (first, second):
        for k in (1, 2, 3):
            write_scale_release(store, model, f"r{k}", k=float(k))
    path = models_file(tmp_path / "models.yaml", {first: "r1", second: "r2"})

    before = cli(daemon, "diff", "-f", str(path), "-o", "json")
    assert before.returncode == EXIT_DIFFERS, before.stderr
    assert [(m["model"], m["current"], m["wanted"]) for m in document(before)["models"]] == [
        (first, None, "r1"),
        (second, None, "r2"),
    ]

    applied = cli(daemon, "apply", "-f", str(path), "--wait", "-o", "json")
    assert applied.returncode == 0, applied.stderr
    done = document(applied)["models"]
    assert [(m["model"], m["operation"]["status"]) for m in done] == [
        (first, "succeeded"),
        (second, "succeeded"),
    ]
    assert infer_once(triton.grpc_url, first) == 1.0
    assert infer_once(triton.grpc_url, second) == 2.0
    reason = operations(daemon, first)[0]["reason"]
    assert reason == f"controlplane apply -f {path}"

    again = cli(daemon, "apply", "-f", str(path), "--wait")
    assert again.returncode == 0, again.stderr
    assert "nothing to apply" in again.stdout
    assert [len(operations(daemon, m)) for m in (first, second)] == [1, 1]
    agrees = cli(daemon, "diff", "-f", str(path))
    assert agrees.returncode == 0, agrees.stdout + agrees.stderr

    models_file(path, {first: "r1", second: "r3"})  # an edit of one model
    table = cli(daemon, "diff", "-f", str(path))
    assert table.returncode == EXIT_DIFFERS
    rows = [line.split() for line in table.stdout.splitlines()]
    assert rows == [
        ["MODEL", "NOW", "FILE", "ACTION"],
        [first, "r1", "r1", "unchanged"],
        [second, "r2", "r3", "deploy"],
    ]

    dry = cli(daemon, "apply", "-f", str(path), "--dry-run", "-o", "json")
    assert dry.returncode == 0, dry.stderr
    assert document(dry)["dry_run"] is True
    assert [len(operations(daemon, m)) for m in (first, second)] == [1, 1]
    assert infer_once(triton.grpc_url, second) == 2.0

    edited = cli(daemon, "apply", "-f", "-", "--wait", stdin=path.read_text())
    assert edited.returncode == 0, edited.stderr
    assert [len(operations(daemon, m)) for m in (first, second)] == [1, 2]
    assert infer_once(triton.grpc_url, first) == 1.0
    assert infer_once(triton.grpc_url, second) == 3.0


def test_a_refused_release_stops_the_apply_at_that_model_and_names_it(
    shared: tuple[Daemon, Path], triton: RunningTriton, model_name: str, tmp_path: Path
) -> None:
    daemon, store = shared
    first, second, third = (f"{model_name}-{x}" for x in "abc")
    for model in (first, second, third):
        write_scale_release(store, model, "r1", k=1.0)
    path = models_file(tmp_path / "models.yaml", {first: "r1", second: "r9", third: "r1"})

    result = cli(daemon, "apply", "-f", str(path), "--wait", "-o", "json")

    assert result.returncode == 1, result.stdout
    answer = document(result)
    assert answer["error"]["code"] == "release_not_found"
    assert answer["error"]["message"].startswith(f"{second} r9: ")
    by_model = {m["model"]: m for m in answer["models"]}
    assert by_model[first]["operation"]["status"] == "succeeded"
    assert by_model[second]["error"]["code"] == "release_not_found"
    assert set(by_model[third]) == {"model", "current", "wanted", "changed"}  # not started
    assert infer_once(triton.grpc_url, first) == 1.0
    assert operations(daemon, third) == []


def test_a_daemon_outside_a_fleet_is_compared_with_what_it_serves(
    pooled_tritons: Callable[[Path], RunningTriton], model_name: str, tmp_path: Path
) -> None:
    triton = pooled_tritons(tmp_path)  # the module's daemon holds the session Triton's repository
    store = tmp_path / "store"
    store.mkdir()
    write_scale_release(store, model_name, "r1", k=1.0)
    daemon = start_daemon(
        triton=triton,
        store=store,
        workdir=tmp_path,
        token=TOKEN,
        extra_env={"CONTROLPLANE_FLEET__ENABLED": "false"},
    )
    try:
        path = models_file(tmp_path / "models.yaml", {model_name: "r1"})
        assert cli(daemon, "diff", "-f", str(path)).returncode == EXIT_DIFFERS

        applied = cli(daemon, "apply", "-f", str(path), "--wait")
        assert applied.returncode == 0, applied.stderr

        again = cli(daemon, "diff", "-f", str(path), "-o", "json")
        assert again.returncode == 0, again.stdout
        assert document(again)["models"][0]["current"] == "r1"
        assert len(operations(daemon, model_name)) == 1
    finally:
        daemon.stop()
