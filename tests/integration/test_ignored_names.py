"""Releases and models whose names break the naming rules, published complete to a directory
store and to S3 (moto's server): the daemon says so, in its answers, in `controlplane status`
and once in its log, and the valid releases beside them deploy as ever."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory
from tests.integration.test_cli import cli_env
from tests.support.daemon import Daemon
from tests.support.inference import infer_once
from tests.support.models import write_scale_release
from tests.support.polling import eventually
from tests.support.s3 import aws_env, upload_release_dir
from tests.support.s3_fixtures import moto_endpoint, s3_bucket  # noqa: F401

pytestmark = pytest.mark.triton
PREFIX = "models"
BAD_RELEASES = ('"quote', "<img src=x onerror=alert(7)>", "r 5")  # as the answers sort them
BAD_MODEL = "evil<b>x"
RULE = (
    "is not allowed: use letters, digits, '.', '_' and '-', start with a letter or digit, and do "
    "not use '..'"
)
SCANS = "store:\n  poll_interval_seconds: 0.2\n  full_scan_seconds: 0.2\n"


@dataclass(frozen=True)
class Store:
    """A store under test: how to publish a release to it (SHA256SUMS last), how to start a
    daemon on it, and where a dir is, as the daemon's log names it."""

    publish: Callable[[str, str], None]
    start: Callable[[], Daemon]
    base: str  # the store's path or s3:// URL
    suffix: str  # after a dir's name: "/" for an S3 prefix

    def where(self, *names: str) -> str:
        return "/".join((self.base, *names)) + self.suffix


@pytest.fixture(params=["directory", "s3"])
def store(
    request: pytest.FixtureRequest, daemons: DaemonFactory, tmp_path: Path
) -> Iterator[Store]:
    root = tmp_path / "store"
    root.mkdir()
    if request.param == "directory":
        yield Store(
            publish=lambda model, release: _write(root, model, release),
            start=lambda: daemons(root, config=SCANS),
            base=str(root),
            suffix="",
        )
        return
    endpoint: str = request.getfixturevalue("moto_endpoint")
    client, bucket = request.getfixturevalue("s3_bucket")

    def upload(model: str, release: str) -> None:
        written = write_scale_release(tmp_path / "out", model, release, k=1.0)
        upload_release_dir(client, bucket, PREFIX, written)

    yield Store(
        publish=upload,
        start=lambda: daemons(
            root, store_uri=f"s3://{bucket}/{PREFIX}", extra_env=aws_env(endpoint), config=SCANS
        ),
        base=f"s3://{bucket}/{PREFIX}",
        suffix="/",
    )


def _write(root: Path, model: str, release: str) -> None:
    write_scale_release(root, model, release, k=1.0)


def _full_scans(daemon: Daemon, count: int) -> None:
    """Wait until the watcher has listed the whole store ``count`` more times."""
    seen: set[str] = set()

    def scanned() -> bool:
        as_of = daemon.get("/v1/models").json()["as_of"]
        if as_of["store_full_scan"]:
            seen.add(as_of["store_full_scan"])
        return len(seen) > count

    eventually(scanned, 60, f"{count} full scans of the store")


def _warnings(daemon: Daemon) -> list[str]:
    lines = [json.loads(line) for line in daemon.log().splitlines() if line.startswith("{")]
    return [
        line["message"]
        for line in lines
        if line["level"] == "warning" and line["message"].startswith("ignoring ")
    ]


def _status(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controlplane", "status", *args],
        env=cli_env(daemon.url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_ignored_names_are_shown_and_logged_once_and_valid_releases_still_deploy(
    store: Store, model_name: str, triton: RunningTriton
) -> None:
    for release in ("r1", *BAD_RELEASES):
        store.publish(model_name, release)
    store.publish(BAD_MODEL, "r1")
    daemon = store.start()
    _full_scans(daemon, 3)

    one = daemon.get(f"/v1/models/{model_name}")
    assert one.status_code == 200, one.text
    assert [r["name"] for r in one.json()["releases"]] == ["r1"]
    ignored = one.json()["ignored_releases"]
    assert [entry["name"] for entry in ignored] == list(BAD_RELEASES)
    assert ignored[2]["reason"] == f"release name 'r 5' {RULE}"
    listed = daemon.get("/v1/models")
    assert listed.json()["ignored_models"] == [
        {"name": BAD_MODEL, "reason": f"model name {BAD_MODEL!r} {RULE}"}
    ]
    assert '{"name":"\\"quote","reason":' in listed.text  # the names are JSON text
    [view] = [m for m in listed.json()["models"] if m["name"] == model_name]
    assert view["ignored_releases"] == ignored

    # Logged once each, however many scans saw them: where, which rule, what to do.
    warnings = _warnings(daemon)
    for bad in BAD_RELEASES:
        [said] = [w for w in warnings if w.startswith(f"ignoring {store.where(model_name, bad)} ")]
        assert f"release name {bad!r} {RULE}" in said
        assert f"rename it to be seen as a release of {model_name}" in said
    [said] = [w for w in warnings if w.startswith(f"ignoring {store.where(BAD_MODEL)} ")]
    assert "rename it to be seen as a model" in said
    assert len(warnings) == len(BAD_RELEASES) + 1

    table = _status(daemon)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == f"ignored: {BAD_MODEL!r} (not model names: rename them)"
    shown = ", ".join(repr(bad) for bad in BAD_RELEASES)
    assert f"  ignored:   {shown} (not release names: rename them)" in lines
    every = json.loads(_status(daemon, "-o", "json").stdout)
    assert every["ignored_models"] == listed.json()["ignored_models"]
    assert json.loads(_status(daemon, model_name, "-o", "json").stdout)["ignored_releases"] == (
        ignored
    )

    refused = daemon.deploy(model_name, "r 5")
    assert refused.json()["error"]["code"] == "invalid_name"
    deployed = daemon.deploy(model_name, "r1")
    assert deployed.status_code == 200, deployed.text
    assert infer_once(triton.grpc_url, model_name) == 1.0
    _full_scans(daemon, 2)
    assert len(_warnings(daemon)) == len(BAD_RELEASES) + 1
