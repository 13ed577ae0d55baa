"""The documentation's configuration blocks are what the tools that read them accept.

Each block is read from README.md and docs/*.md when the tests run and checked by the program
it is written for: settings by the daemon's own `load_settings` (every value the block shows
must come back, and a typo fails), Alertmanager config by `amtool check-config`, alert rules by
`promtool check rules`, a kustomize patch by `kubectl kustomize` (the venv's kubectl 1.32, with
no warning) over the shipped overlay, and JSON by a JSON parser (a smoke sample by the daemon's
own parser). test_readme.py's coverage test fails on a YAML block that none of these takes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane.domain.smoke import parse_smoke
from controlplane.settings import Settings, SettingsError, load_settings
from tests.support.kubectl import kustomize
from tests.support.readme import Block, kind_of, read_documents

REPO_ROOT = Path(__file__).resolve().parents[2]
BLOCKS = read_documents(REPO_ROOT)


def blocks_of(kind: str) -> list[Block]:
    return [b for b in BLOCKS if b.marker is None and kind_of(b) == kind]


def ids(blocks: list[Block]) -> list[str]:
    return [b.id for b in blocks]


def leaves(data: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every scalar in nested mappings, with the keys that lead to it."""
    if isinstance(data, dict):
        return [leaf for key, value in data.items() for leaf in leaves(value, (*path, str(key)))]
    return [(path, data)]


def load_block(text: str, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """`controlplane serve --config` on the block alone: the environment holds only the two
    settings every daemon needs, and only when the block does not give them."""
    for name in list(os.environ):
        if name.startswith("CONTROLPLANE_"):
            monkeypatch.delenv(name)
    data = yaml.safe_load(text)
    if "path" not in (data.get("repository") or {}):
        monkeypatch.setenv("CONTROLPLANE_REPOSITORY__PATH", str(workdir / "repository"))
    if "uri" not in (data.get("store") or {}):
        monkeypatch.setenv("CONTROLPLANE_STORE__URI", (workdir / "store").as_uri())
    config = workdir / "controlplane.yaml"
    config.write_text(text, encoding="utf-8")
    return load_settings(config)


@pytest.mark.parametrize("block", blocks_of("settings"), ids=ids(blocks_of("settings")))
def test_a_settings_block_loads_with_every_value_it_shows(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        settings = load_block(block.text, tmp_path, monkeypatch)
    except SettingsError as exc:
        pytest.fail(f"{block.where} is refused by the daemon:\n{exc}")

    loaded = settings.model_dump(mode="json")
    for path, shown in leaves(yaml.safe_load(block.text)):
        value: Any = loaded
        for key in path:
            value = value[key]
        assert value == shown, f"{block.where}: {'.'.join(path)} loads as {value!r}"


def test_a_typo_in_a_settings_block_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = blocks_of("settings")[0]
    path, _value = leaves(yaml.safe_load(block.text))[0]
    key = path[-1]
    typo = block.text.replace(f"{key}:", f"{key[:-1]}:", 1)  # one letter short

    meant = rf"{key[:-1]} \(in .*\): there is no such setting; did you mean '{key}'\?"
    with pytest.raises(SettingsError, match=meant):
        load_block(typo, tmp_path, monkeypatch)


def run_tool(*command: str) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, f"{' '.join(command)}:\n{result.stdout}{result.stderr}"
    return result.stdout


@pytest.mark.parametrize("block", blocks_of("alertmanager"), ids=ids(blocks_of("alertmanager")))
def test_an_alertmanager_block_passes_amtool(block: Block, tmp_path: Path) -> None:
    config = yaml.safe_load(block.text)
    receivers = [r["name"] for r in config["receivers"]]
    # The README shows the receiver; a config needs a route to it, as the user's already has.
    config.setdefault("route", {"receiver": receivers[0]})
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")

    out = run_tool("amtool", "check-config", str(path))

    assert "SUCCESS" in out


@pytest.mark.parametrize(
    "block", blocks_of("prometheus-rules"), ids=ids(blocks_of("prometheus-rules"))
)
def test_an_alert_rule_block_passes_promtool(block: Block, tmp_path: Path) -> None:
    path = tmp_path / "rules.yml"
    rules = {"groups": [{"name": "readme", "rules": yaml.safe_load(block.text)}]}
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")

    out = run_tool("promtool", "check", "rules", str(path))

    assert "SUCCESS" in out


@pytest.mark.parametrize(
    "block", blocks_of("kustomize-patch"), ids=ids(blocks_of("kustomize-patch"))
)
def test_a_kustomize_patch_block_renders_over_the_shipped_overlay(
    block: Block, tmp_path: Path
) -> None:
    patch = yaml.safe_load(block.text)
    (tmp_path / "patch.yaml").write_text(block.text, encoding="utf-8")
    base = os.path.relpath(REPO_ROOT / "deploy" / "k8s" / "overlays" / "local-store", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"resources:\n  - {base}\npatches:\n  - path: patch.yaml\n", encoding="utf-8"
    )

    done = kustomize(tmp_path)

    assert done.returncode == 0, done.stderr
    assert done.stderr == "", "the README's recipe makes kustomize warn"
    rendered = list(yaml.safe_load_all(done.stdout))
    kinds = {(doc["kind"], doc["metadata"]["name"]) for doc in rendered if doc}
    target = (patch["kind"], patch["metadata"]["name"])
    assert ("Deployment", "triton") in kinds
    assert target not in kinds, f"the README's delete patch leaves {target} in"


@pytest.mark.parametrize("block", blocks_of("json"), ids=ids(blocks_of("json")))
def test_a_json_block_parses(block: Block) -> None:
    try:
        data = json.loads(block.text)
    except ValueError as exc:
        pytest.fail(f"{block.where} is not JSON ({exc}); fix it, or label it text")
    if isinstance(data, dict) and "inputs" in data:  # a smoke.json sample
        parse_smoke(block.text)
