"""The CLI as a CI job and an operator run it, against one real daemon and the real Triton:
exit codes, one line per finished step, a readable status, and `-o json|yaml` documents that a
script parses, on success and on failure alike."""

from __future__ import annotations

import itertools
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.launcher import RunningTriton, free_port
from tests.support.daemon import Daemon, start_daemon
from tests.support.inference import infer_once
from tests.support.models import corrupt_file, write_scale_release
from tests.support.watching import blocks, watching

pytestmark = pytest.mark.triton
TOKEN = "cli-token"
EXIT_FAILED, EXIT_UNREACHABLE, EXIT_GAVE_UP = 1, 3, 4


def cli_env(daemon_url: str | None, token: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    if daemon_url is not None:
        env["CONTROLPLANE_URL"] = daemon_url
    if token is not None:
        env["CONTROLPLANE_TOKEN"] = token
    return env


def cli(daemon_url: str, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controlplane", *args],
        env=cli_env(daemon_url, token),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def document(result: subprocess.CompletedProcess[str]) -> Any:
    """stdout as the one JSON document it must be (a line of anything else fails here)."""
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def shared(
    triton: RunningTriton, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Daemon, Path]]:
    """One daemon (with an API token) and its store for the whole module; each test has
    models of its own."""
    workdir = tmp_path_factory.mktemp("cli")
    store = workdir / "store"
    store.mkdir()
    daemon = start_daemon(triton=triton, store=store, workdir=workdir, token=TOKEN)
    try:
        yield daemon, store
    finally:
        daemon.stop()


@pytest.fixture
def daemon(shared: tuple[Daemon, Path]) -> Daemon:
    return shared[0]


@pytest.fixture
def store(shared: tuple[Daemon, Path]) -> Path:
    return shared[1]


def test_deploy_wait_prints_each_step_and_exits_0(
    daemon: Daemon, store: Path, model_name: str, triton: RunningTriton
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)
    write_scale_release(store, model_name, "r2", k=2.0)

    result = cli(daemon.url, "deploy", model_name, "r1", "--wait", token=TOKEN)

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    steps = [line.split()[1] for line in lines if line.startswith("  ok ")]
    assert steps == [  # blue-green, the default strategy
        "resolve",
        "fetch",
        "verify",
        "check",
        "headroom",
        "place",
        "load",
        "preflight",
        "switch",
        "record",
        "publish",  # the fleet's desired state (a fleet of one here) moves last
    ]
    assert all(line.split()[2].replace(".", "").isdigit() for line in lines if "  ok " in line)
    assert lines[-1].startswith("succeeded in ")
    assert infer_once(triton.grpc_url, model_name) == 1.0
    operation = daemon.get(f"/v1/operations?model={model_name}&limit=1").json()["operations"][0]
    assert operation["trigger"] == "cli"

    result = cli(daemon.url, "deploy", model_name, "r2", "--wait", token=TOKEN)
    assert result.returncode == 0, result.stderr
    status = cli(daemon.url, "status", model_name)
    assert status.returncode == 0
    assert "active:    r2" in status.stdout
    assert "previous:  r1" in status.stdout
    assert "READY" in status.stdout

    rollback = cli(daemon.url, "rollback", model_name, "--wait", token=TOKEN)
    assert rollback.returncode == 0, rollback.stderr
    assert infer_once(triton.grpc_url, model_name) == 1.0


def test_every_command_prints_the_apis_data_as_one_document(
    daemon: Daemon, store: Path, model_name: str
) -> None:
    model = model_name
    write_scale_release(store, model, "r1", k=1.0)
    write_scale_release(store, model, "r2", k=2.0)

    first = cli(daemon.url, "deploy", model, "r1", "--wait", "-o", "json", token=TOKEN)
    assert first.returncode == 0, first.stderr
    deployed = document(first)["operation"]
    assert (deployed["kind"], deployed["release"], deployed["status"]) == (
        "deploy",
        "r1",
        "succeeded",
    )
    assert deployed == daemon.get(f"/v1/operations/{deployed['id']}").json()["operation"]
    assert "  ok  load" in first.stderr  # progress still shows, on stderr
    second = cli(
        daemon.url,
        "deploy",
        model,
        "r2",
        "--wait",
        "--output",
        "yaml",
        "--reason",
        "ticket 7",
        token=TOKEN,
    )
    assert second.returncode == 0, second.stderr
    assert yaml.safe_load(second.stdout)["operation"]["reason"] == "ticket 7"

    status = cli(daemon.url, "status", model, "-o", "json")
    assert status.returncode == 0, status.stderr
    view = document(status)
    assert (view["name"], view["active_release"], view["previous_release"]) == (model, "r2", "r1")
    assert view.keys() == daemon.get(f"/v1/models/{model}").json().keys()
    every = document(cli(daemon.url, "status", "-o", "json"))
    assert model in [m["name"] for m in every["models"]]
    as_yaml = yaml.safe_load(cli(daemon.url, "status", model, "-o", "yaml").stdout)
    assert (as_yaml["name"], as_yaml["active_release"]) == (model, "r2")

    fleet = cli(daemon.url, "fleet", "-o", "json")
    assert fleet.returncode == 0, fleet.stderr
    assert document(fleet)["models"][model]["desired"] == "r2"

    back = cli(daemon.url, "rollback", model, "--wait", "-o", "json", token=TOKEN)
    assert back.returncode == 0, back.stderr
    rolled = document(back)["operation"]
    assert (rolled["kind"], rolled["release"], rolled["from_release"]) == ("rollback", "r1", "r2")

    gone = cli(daemon.url, "unload", model, "--wait", "-o", "json", token=TOKEN)
    assert gone.returncode == 0, gone.stderr
    unloaded = document(gone)["operation"]
    assert (unloaded["kind"], unloaded["status"]) == ("unload", "succeeded")

    listed = cli(daemon.url, "operations", "--model", model, "--limit", "10", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    recent = [op for op in document(listed)["operations"] if op["kind"] != "retire"]
    reasoned = yaml.safe_load(second.stdout)["operation"]
    assert [op["id"] for op in recent] == [
        unloaded["id"],
        rolled["id"],
        reasoned["id"],
        deployed["id"],
    ]
    one = cli(daemon.url, "operations", rolled["id"], "-o", "json")
    assert document(one)["operation"]["id"] == rolled["id"]

    history = cli(daemon.url, "history", model, "-o", "json")
    assert history.returncode == 0, history.stderr
    ops = document(history)["operations"]
    assert [op["id"] for op in ops if op["kind"] != "retire"] == [op["id"] for op in recent]
    member = daemon.get("/healthz").json()["fleet"]["member"]
    assert {(op["trigger"], op["member"]) for op in recent} == {("cli", member)}
    assert [op["reason"] for op in recent] == [None, None, "ticket 7", None]
    assert yaml.safe_load(cli(daemon.url, "history", model, "-o", "yaml").stdout) == {
        "operations": ops
    }

    table = cli(daemon.url, "history", model)
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split() == [
        "WHEN",
        "OPERATION",
        "KIND",
        "CHANGE",
        "STATUS",
        "BY",
        "MEMBER",
        "WHY",
    ]
    (row,) = (row for row in rows if reasoned["id"] in row)
    assert row.split()[2:] == [
        "deploy",
        "r1",
        "->",
        "r2",
        "succeeded",
        "cli",
        member,
        "ticket",
        "7",
    ]


@pytest.mark.parametrize("spelled", ["zz/../{m}", "{m}/..", "./{m}", "{m}%2F..", "{m}/"])
def test_a_model_name_that_spells_a_path_is_refused_and_no_other_model_changes(
    daemon: Daemon, store: Path, model_name: str, triton: RunningTriton, spelled: str
) -> None:
    """Found from outside: the HTTP client resolves dot segments, so 'deploy zz/../m r2'
    deployed r2 to m (and in a fleet, to every member)."""
    write_scale_release(store, model_name, "r1", k=1.0)
    write_scale_release(store, model_name, "r2", k=2.0)
    assert cli(daemon.url, "deploy", model_name, "r1", "--wait", token=TOKEN).returncode == 0
    name = spelled.format(m=model_name)

    for args in (("deploy", name, "r2", "--wait"), ("unload", name), ("rollback", name)):
        result = cli(daemon.url, *args, token=TOKEN)

        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "invalid_name" in result.stderr, result.stderr
        assert result.stdout == ""
    for reads in (("status", name), ("history", name), ("operations", "--model", name)):
        assert cli(daemon.url, *reads).returncode == 2, reads

    assert infer_once(triton.grpc_url, model_name) == 1.0
    assert daemon.get(f"/v1/models/{model_name}").json()["active_release"] == "r1"


def test_a_failed_deploy_exits_1_with_the_error_code(
    daemon: Daemon, store: Path, model_name: str
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0, fail_init=True)

    result = cli(daemon.url, "deploy", model_name, "r1", "--wait", token=TOKEN)

    assert result.returncode == EXIT_FAILED
    assert "FAILED load" in result.stdout
    assert "triton_load_failed" in result.stderr
    missing = cli(daemon.url, "deploy", model_name, "nope", "--wait", token=TOKEN)
    assert missing.returncode == EXIT_FAILED
    assert "release_not_found" in missing.stderr


def test_a_release_with_a_bad_checksum_exits_1_and_says_why_in_json_too(
    daemon: Daemon, store: Path, model_name: str
) -> None:
    # A k of its own: a file whose listed hash the daemon's content cache holds is taken
    # from the cache, not from the store, and would deploy.
    corrupt_file(write_scale_release(store, model_name, "bad", k=41.0))

    failed = cli(daemon.url, "deploy", model_name, "bad", "--wait", "-o", "json", token=TOKEN)

    assert failed.returncode == EXIT_FAILED, failed.stderr
    body = document(failed)
    assert body["error"]["code"] == "checksum_mismatch"
    assert (body["operation"]["status"], body["operation"]["error"]) == ("failed", body["error"])
    assert "FAILED verify" in failed.stderr
    # Refused before any operation starts: the API's error body, as the document.
    refused = cli(daemon.url, "deploy", model_name, "absent", "--wait", "-o", "json", token=TOKEN)
    assert refused.returncode == EXIT_FAILED
    assert document(refused)["error"]["code"] == "release_not_found"
    assert refused.stderr == ""


def test_giving_up_waiting_exits_4_and_the_operation_goes_on(
    daemon: Daemon, store: Path, model_name: str
) -> None:
    write_scale_release(store, model_name, "slow", k=1.0, init_sleep=4.0)

    result = cli(
        daemon.url,
        "deploy",
        model_name,
        "slow",
        "--wait",
        "--timeout",
        "1",
        "-o",
        "json",
        token=TOKEN,
    )

    assert result.returncode == EXIT_GAVE_UP, result.stderr
    body = document(result)
    assert body["error"]["code"] == "gave_up_waiting"
    assert body["operation"]["status"] == "running"
    table = cli(daemon.url, "wait", body["operation"]["id"], "--timeout", "0")
    assert table.returncode == EXIT_GAVE_UP
    assert "gave up waiting after 0 s; the operation goes on" in table.stderr
    # It went on: `wait` follows it to its end.
    done = cli(daemon.url, "wait", body["operation"]["id"], "-o", "json")
    assert done.returncode == 0, done.stderr
    assert document(done)["operation"]["status"] == "succeeded"
    assert daemon.get(f"/v1/models/{model_name}").json()["active_release"] == "slow"
    unknown = cli(daemon.url, "wait", "0123456789abcdef")
    assert unknown.returncode == EXIT_FAILED
    assert "operation_not_found" in unknown.stderr


def test_without_wait_the_printed_command_follows_the_operation(
    daemon: Daemon, store: Path, model_name: str, tmp_path: Path
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)

    started = cli(daemon.url, "deploy", model_name, "r1", "--no-wait", token=TOKEN)

    assert started.returncode == 0, started.stderr
    lines = started.stdout.splitlines()
    follow = next(line for line in lines if line.startswith("follow it with: "))
    command = follow.removeprefix("follow it with: ")
    # Pasted into a shell with nothing set: the command names the daemon itself.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "controlplane").write_text(
        f'#!/bin/sh\nexec "{sys.executable}" -m controlplane "$@"\n'
    )
    (bin_dir / "controlplane").chmod(0o755)
    env = cli_env(None)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    pasted = subprocess.run(
        ["bash", "-c", command], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert pasted.returncode == 0, pasted.stderr
    assert "  ok  load" in pasted.stdout
    assert pasted.stdout.splitlines()[-1].startswith("succeeded in ")
    assert shlex.split(command)[:2] == ["controlplane", "wait"]

    # With -o json: the started operation is the document; how to follow it goes to stderr.
    again = cli(daemon.url, "rollback", model_name, "--to", "r1", "-o", "json", token=TOKEN)
    assert again.returncode == 0, again.stderr
    assert document(again) == {
        "unchanged": True,
        "model": model_name,
        "release": "r1",
        "message": document(again)["message"],
    }
    write_scale_release(store, model_name, "r2", k=2.0)
    quiet = cli(daemon.url, "deploy", model_name, "r2", "-o", "json", token=TOKEN)
    assert quiet.returncode == 0, quiet.stderr
    assert document(quiet)["operation"]["status"] in ("running", "succeeded")
    assert "follow it with: controlplane wait " in quiet.stderr
    daemon.wait_operation(document(quiet)["operation"]["id"])


def test_status_watch_prints_each_change_and_stops_on_ctrl_c(
    daemon: Daemon, store: Path, model_name: str
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)
    write_scale_release(store, model_name, "r2", k=2.0)
    assert daemon.deploy(model_name, "r1").status_code == 200
    every = ("--interval", "0.2")
    with (
        watching(cli_env(daemon.url), model_name, *every) as (table_watch, table),
        watching(cli_env(daemon.url), model_name, *every, "-o", "json") as (json_watch, as_json),
    ):
        table.wait_for(lambda lines: "  active:    r1" in lines, "the first view")
        as_json.wait_for(lambda lines: len(lines) >= 1, "the first document")

        assert daemon.deploy(model_name, "r2").status_code == 200

        seen = table.wait_for(lambda lines: "  active:    r2" in lines, "a view once r2 serves")
        views = blocks(seen)
        assert "  active:    r1" in views[0]
        assert all(a != b for a, b in itertools.pairwise(views))  # a view is printed on a change
        documents = as_json.wait_for(
            lambda lines: json.loads(lines[-1])["active_release"] == "r2", "r2 in a document"
        )
        assert json.loads(documents[0])["active_release"] == "r1"
        assert all(a != b for a, b in itertools.pairwise(documents))
        for process in (table_watch, json_watch):
            process.send_signal(signal.SIGINT)  # Ctrl-C
        for process in (table_watch, json_watch):
            assert process.wait(timeout=30) == 0
            assert process.stderr is not None
            assert process.stderr.read() == ""


def test_without_a_token_the_cli_is_refused_and_says_why(
    daemon: Daemon, store: Path, model_name: str
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)

    result = cli(daemon.url, "deploy", model_name, "r1")

    assert result.returncode == EXIT_FAILED
    assert "unauthorized" in result.stderr


def test_an_unreachable_daemon_exits_3() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = cli(url, "status")
    assert result.returncode == EXIT_UNREACHABLE
    assert "cannot reach the control plane" in result.stderr

    as_json = cli(url, "deploy", "m", "r1", "--wait", "-o", "json")
    assert as_json.returncode == EXIT_UNREACHABLE
    assert document(as_json)["error"]["code"] == "unreachable"
