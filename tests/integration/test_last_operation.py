"""Issue 24, as the trial found it, against the real Triton: a deploy fails right after one that
succeeded, and the daemon's retire of the old slot comes after both. ``controlplane status``
and the status page still show the failed deploy as the last operation, and the retire apart
(``upkeep:``, the page's Housekeeping)."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import DaemonFactory
from tests.integration.test_cli import cli, document
from tests.support.daemon import Daemon
from tests.support.models import corrupt_file, write_scale_release
from tests.support.polling import eventually

pytestmark = pytest.mark.triton
RETIRE_AFTER = 5.0  # the old slot's keep-warm time (30 s by default): r3 fails well before


class _Operations(HTMLParser):
    """The ids of the operations the page lists under each ``data-field`` of one model."""

    def __init__(self, markup: str, model: str) -> None:
        super().__init__(convert_charrefs=True)
        self.model = model
        self.listed: dict[str, list[str]] = {}
        self._in_model = False
        self._field: str | None = None
        self.feed(markup)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "section":
            self._in_model = found.get("data-model") == self.model
        elif self._in_model and tag in ("ol", "p") and found.get("data-field"):
            self._field = found["data-field"]
            self.listed.setdefault(self._field or "", [])
        elif self._in_model and self._field and found.get("data-operation"):
            self.listed[self._field].append(found["data-operation"] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("ol", "p"):
            self._field = None


def _operations(daemon: Daemon, model: str) -> list[dict[str, Any]]:
    answer = daemon.get(f"/v1/operations?model={model}&limit=10")
    assert answer.status_code == 200, answer.text
    operations: list[dict[str, Any]] = answer.json()["operations"]
    return operations


def test_a_failed_deploy_stays_the_last_op_when_the_old_slot_is_retired_after_it(
    daemons: DaemonFactory, store: Path, model_name: str
) -> None:
    write_scale_release(store, model_name, "r1", k=61.0)
    write_scale_release(store, model_name, "r2", k=62.0)
    corrupt_file(write_scale_release(store, model_name, "r3", k=63.0))
    daemon = daemons(
        store,
        config=(
            f"models:\n  {model_name}:\n    strategy: blue-green\n"
            f"    retire_after_seconds: {RETIRE_AFTER}\n    drain_timeout_seconds: 5\n"
        ),
    )
    for release in ("r1", "r2"):
        answer = daemon.deploy(model_name, release)
        assert answer.status_code == 200, answer.text
    failed = daemon.deploy(model_name, "r3").json()["operation"]
    assert (failed["status"], failed["error"]["code"]) == ("failed", "checksum_mismatch")

    def retired() -> dict[str, Any] | None:
        done = [
            op
            for op in _operations(daemon, model_name)
            if op["kind"] == "retire" and op["status"] == "succeeded"
        ]
        return done[0] if done else None

    eventually(lambda: retired() is not None, RETIRE_AFTER + 30, "the retire of r1's slot")
    retire = retired()
    assert retire is not None
    assert retire["created_at"] > failed["created_at"]  # the trial's order: it came after
    assert _operations(daemon, model_name)[0]["id"] == retire["id"]

    shown = cli(daemon.url, "status", model_name)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    [last_op] = [line for line in lines if line.startswith("  last op:")]
    [upkeep] = [line for line in lines if line.startswith("  upkeep:")]
    assert last_op.split() == [
        "last", "op:", "deploy", "r3", "failed", "(checksum_mismatch)", f"[{failed['id']}]"
    ]  # fmt: skip
    assert upkeep.startswith(f"  upkeep:    retire succeeded at {retire['created_at']}: ")
    assert "no longer serves" in upkeep  # which slot, and why it was freed
    assert upkeep.endswith(f"[{retire['id']}]")

    as_json = document(cli(daemon.url, "status", model_name, "-o", "json"))
    assert as_json["last_operation"]["id"] == failed["id"]
    assert as_json["last_housekeeping"]["id"] == retire["id"]

    content = daemon.get("/ui/status")
    assert content.status_code == 200, content.text
    listed = _Operations(content.text, model_name).listed
    assert listed["operations"][0] == failed["id"]
    assert retire["id"] not in listed["operations"]
    assert listed["housekeeping"] == [retire["id"]]
