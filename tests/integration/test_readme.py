"""Every command block of the documentation (README.md and docs/*.md) runs for real in
`make test`, so a pasted recipe works.

The blocks are read from the documents when the tests run (tests/support/readme.py lists them,
in running order), so a block added later is covered without a change here:

- Shell blocks (sh, bash, shell, console) run. One that starts a server (`make run`,
  `tritonserver`, `controlplane serve`) runs with the other server blocks of its section: each
  server is started, checked ready and stopped at the section's end the way the document says.
  Every other shell block runs in bash (`set -euo pipefail`), in document order, against one
  daemon, one Triton and one store (the `world` below); `# -> TEXT` after a command says what it
  must print. After each block, every release it published must deploy with the real daemon.
- CI jobs in YAML (GitHub Actions, GitLab CI) run their scripts in that same order, with the
  variables the CI system would give them. Other YAML is checked by test_readme_configs.py.
- A block that cannot run here says why in `<!-- not run by tests: REASON -->` right before
  its fence; the coverage test fails on any block no test takes and on a marker without a reason.

The README's fixed addresses and placeholders become the test's through explicit tables
(`world_addresses`, `server_addresses`), replaced verbatim before a block runs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.launcher import RunningTriton, launch_triton
from tests.support.daemon import Daemon, start_daemon
from tests.support.models import SHA256SUMS, write_scale_release
from tests.support.readme import (
    CI_JOBS,
    COMMANDS,
    DOCUMENTS,
    SERVERS,
    Block,
    kind_of,
    read_documents,
    stray_markers,
)
from tests.support.readme_servers import VENV_BIN, exports, is_server, servers
from tests.support.s3 import aws_env, moto_server, s3_client

pytestmark = pytest.mark.triton

REPO_ROOT = Path(__file__).resolve().parents[2]
BLOCKS = read_documents(REPO_ROOT)
TOKEN = "readme-token"
RELEASE = "2026-11-29.1"  # the release the README's publisher snippets publish
FALLBACK = "2026-11-01.1"  # the README's fallback_release: resnet serves it first
# The commit a CI job runs for; docs/ci.md's jobs name the release after it (r-<12 hex digits>).
CI_SHA = "3f9c2b7e1d4a6c8b0e2f4a6c8d0b2e4f6a8c0d2e"
CI_RELEASE = f"r-{CI_SHA[:12]}"
# The Service's URL a CI job reads from its variable CONTROLPLANE_URL (docs/ci.md's table).
CI_URL = "http://triton.triton.svc:8080"
BLOCK_TIMEOUT = 300.0
S3_BUCKET, S3_PREFIX = "models", "prod"  # the README's s3://models/prod
AWS_CLI = Path(sys.prefix) / "awscli" / "bin" / "aws"  # make install puts it there

IN_ORDER = [b for b in BLOCKS if b.marker is None and kind_of(b) in (COMMANDS, *CI_JOBS)]
SERVER_SECTIONS = list(
    dict.fromkeys((b.path, b.section) for b in BLOCKS if b.marker is None and kind_of(b) == SERVERS)
)


def test_every_document_is_listed() -> None:
    """A page under docs/ that the list leaves out would go untested."""
    found = {f"docs/{p.name}" for p in (REPO_ROOT / "docs").glob("*.md")}
    assert found - set(DOCUMENTS) == set(), "add these to DOCUMENTS in tests/support/readme.py"
    assert [p for p in DOCUMENTS if not (REPO_ROOT / p).is_file()] == []


def test_every_block_is_run_or_marked_with_a_reason() -> None:
    problems = [
        f"{path}:{line}: a marker that no fence follows"
        for path in DOCUMENTS
        for line in stray_markers((REPO_ROOT / path).read_text(encoding="utf-8"))
    ]
    for block in BLOCKS:
        if block.marker == "":
            problems.append(
                f"{block.where}: write why it cannot run: <!-- not run by tests: REASON -->"
            )
        elif block.marker is None and kind_of(block).startswith("unknown"):
            problems.append(f"{block.where}: {kind_of(block)}; run it here or mark it")
        elif block.marker is None and kind_of(block) == SERVERS:
            for command in block.commands():
                if not is_server(command.text) and not command.text.startswith("export "):
                    problems.append(
                        f"{block.at(command.line)}: a block that starts a server may only "
                        f"export variables besides; move {command.text!r} to a block of its own"
                    )
    assert problems == []
    assert IN_ORDER  # the partition found what it must run
    assert SERVER_SECTIONS


# --- the world the command blocks run against ----------------------------------------------


@dataclass
class World:
    triton: RunningTriton
    daemon: Daemon  # on the local store
    store: Path
    s3_daemon: Daemon  # on s3://models/prod (moto), with a Triton of its own
    s3: Any  # a boto3 client of that bucket's endpoint
    workspace: Path  # each block's working dir
    env: dict[str, str]

    def complete_releases(self) -> set[tuple[str, str, str]]:
        """(store: 'local' or 's3', model, release) of every published release."""
        manifests = self.store.glob(f"*/*/{SHA256SUMS}")
        local = {("local", p.parent.parent.name, p.parent.name) for p in manifests}
        listed = self.s3.list_objects_v2(Bucket=S3_BUCKET, Prefix=f"{S3_PREFIX}/")
        keys = [o["Key"].split("/") for o in listed.get("Contents", [])]
        remote = {("s3", key[1], key[2]) for key in keys if key[-1] == SHA256SUMS}
        return local | remote

    def daemon_of(self, store: str) -> Daemon:
        return self.s3_daemon if store == "s3" else self.daemon


def world_addresses(world: World) -> dict[str, str]:
    """The README's addresses and placeholders in command blocks -> the world's."""
    daemon = world.daemon.url
    return {
        "http://127.0.0.1:8000": world.triton.http_url,  # make run's Triton (Try it)
        "http://127.0.0.1:8080": daemon,  # make run's daemon; also the CLI's default
        "http://cp:8080": daemon,  # the runbook's daemon
        "http://triton.triton.svc:8080": daemon,  # the overlays' Service in the cluster (CI)
        "http://controlplane.triton.svc:8080": daemon,  # the chart's Service (CI)
        ".venv/bin/controlplane": str(VENV_BIN / "controlplane"),
        # docs/helm.md renders the chart from a clone's root; blocks run in a workspace.
        "deploy/helm/": f"{REPO_ROOT / 'deploy' / 'helm'}/",
        "CONTROLPLANE_TOKEN=...": f"CONTROLPLANE_TOKEN={TOKEN}",  # "from the CI's secrets"
    }


def substitute(text: str, table: dict[str, str]) -> str:
    for readme, here in table.items():
        text = text.replace(readme, here)
    return text


@pytest.fixture(scope="module")
def world(triton_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Daemons (API token set) and Tritons of their own. The local store holds the example
    model (as `make run` has it) and resnet: FALLBACK serving, RELEASE written but not yet
    published, CI_RELEASE published (by the build job of docs/ci.md's commit); the workspace
    holds RELEASE as `release/` for the S3 recipe, whose bucket (moto's S3 on loopback) is
    empty. Commands reach only these: AWS_* points at moto."""
    root = tmp_path_factory.mktemp("readme-world")
    store = root / "store"
    shutil.copytree(REPO_ROOT / "examples" / "store", store)
    write_scale_release(store, "resnet", FALLBACK, k=1.0)
    write_scale_release(store, "resnet", RELEASE, k=2.0, checksums=False)
    write_scale_release(store, "resnet", CI_RELEASE, k=4.0)
    published = write_scale_release(root / "for-s3", "resnet", RELEASE, k=3.0)
    shutil.copytree(published, root / "workspace" / "release")
    with contextlib.ExitStack() as stack:
        endpoint = stack.enter_context(moto_server())
        s3 = s3_client(endpoint)
        stack.callback(s3.close)
        s3.create_bucket(Bucket=S3_BUCKET)
        aws = {
            **aws_env(endpoint),
            "AWS_CONFIG_FILE": str(root / "aws-config"),  # none: nothing from this machine
            "AWS_SHARED_CREDENTIALS_FILE": str(root / "aws-credentials"),
        }
        tritons = []
        for name in ("local", "s3"):
            (root / name / "repository").mkdir(parents=True)
            tritons.append(
                stack.enter_context(
                    launch_triton(
                        root / name / "repository",
                        cache_dir=triton_cache,
                        log_path=root / name / "triton.log",
                    )
                )
            )
        with ThreadPoolExecutor(2) as pool:  # both start at once: each takes seconds
            starting = [
                pool.submit(
                    start_daemon,
                    triton=tritons[0],
                    store=store,
                    workdir=root / "local",
                    token=TOKEN,
                ),
                pool.submit(
                    start_daemon,
                    triton=tritons[1],
                    store=store,
                    store_uri=f"s3://{S3_BUCKET}/{S3_PREFIX}",
                    workdir=root / "s3",
                    token=TOKEN,
                    extra_env=aws,
                ),
            ]
            daemon, s3_daemon = (future.result() for future in starting)
        stack.callback(daemon.stop)
        stack.callback(s3_daemon.stop)
        assert daemon.deploy("resnet", FALLBACK).status_code == 200
        yield World(
            triton=tritons[0],
            daemon=daemon,
            store=store,
            s3_daemon=s3_daemon,
            s3=s3,
            workspace=root / "workspace",
            env=_block_env(root, store, daemon, aws),
        )


def _block_env(root: Path, store: Path, daemon: Daemon, aws: dict[str, str]) -> dict[str, str]:
    """What every block's shell starts with: this machine's environment without settings or
    AWS credentials of its own, the test's `find` and the AWS CLI first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTROLPLANE_", "AWS_"))}
    bin_dir = root / "bin"
    bin_dir.mkdir()
    late_find = REPO_ROOT / "tests" / "support" / "late_find.py"
    (bin_dir / "find").write_text(f'#!/bin/sh\nexec "{sys.executable}" "{late_find}" "$@"\n')
    (bin_dir / "find").chmod(0o755)
    real_find = shutil.which("find")
    assert real_find is not None
    assert AWS_CLI.is_file(), f"{AWS_CLI} is missing: run `make install`"
    path = [str(bin_dir), str(AWS_CLI.parent), str(VENV_BIN), env.get("PATH", "")]
    env.update(aws)
    env.update(
        {
            "PATH": os.pathsep.join(path),
            "README_REAL_FIND": real_find,
            "STORE": str(store),
            "RELEASE": RELEASE,
            "CONTROLPLANE_URL": daemon.url,
            "CONTROLPLANE_TOKEN": TOKEN,
        }
    )
    return env


# --- command blocks and CI jobs, in document order ----------------------------------------


def run_bash(script: str, world: World, env: dict[str, str], where: str) -> str:
    """Run `script` in bash with `set -euo pipefail`; fail naming `where`; return stdout."""
    result = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + script],
        cwd=world.workspace,
        env={**world.env, **env, "README_BLOCK_STARTED": repr(time.time())},
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, (
        f"{where} failed with exit code {result.returncode}:\n--- script\n{script}\n"
        f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )
    return result.stdout


def run_commands(block: Block, world: World) -> None:
    """The block's commands in one bash; each `# -> TEXT` must be in its command's output."""
    table = world_addresses(world)
    commands = block.commands()
    marks = [f"@@readme-{block.id}-{i}@@" for i in range(len(commands))]
    script = "\n".join(
        substitute(c.text, table) + (f"\nprintf '\\n%s\\n' {mark}" if c.expect else "")
        for c, mark in zip(commands, marks, strict=True)
    )
    out = run_bash(script, world, {}, block.where)
    for command, mark in zip(commands, marks, strict=True):
        if command.expect:
            printed, _, out = out.partition(mark)
            for expected in command.expect:
                assert expected in printed, (
                    f"{block.at(command.line)}: {command.text!r} should print {expected!r}; "
                    f"it printed:\n{printed}"
                )


def github_expressions() -> dict[str, str]:
    """What GitHub gives a workflow run: the repository's secret and variable."""
    return {"secrets.CONTROLPLANE_TOKEN": TOKEN, "vars.CONTROLPLANE_URL": CI_URL}


def run_github_actions(block: Block, world: World) -> None:
    """Each step's `run` in bash -e (GitHub's default shell), with its `env` and the runner's
    GITHUB_SHA."""

    def expand(text: str) -> str:
        def value(match: re.Match[str]) -> str:
            name = match.group(1).strip()
            assert name in github_expressions(), f"{block.where}: no value for ${{{{ {name} }}}}"
            return github_expressions()[name]

        return substitute(re.sub(r"\$\{\{(.*?)\}\}", value, text), world_addresses(world))

    workflow = yaml.safe_load(block.text)
    steps = [step for job in workflow["jobs"].values() for step in job["steps"] if "run" in step]
    assert steps, f"{block.where}: a workflow with no run step"
    for step in steps:
        env = {"GITHUB_SHA": CI_SHA}
        env.update({name: expand(str(v)) for name, v in (step.get("env") or {}).items()})
        run_bash(expand(step["run"]), world, env, f"{block.where}, step {step.get('name')!r}")


def run_gitlab_ci(block: Block, world: World) -> None:
    """Each job's `script` lines in order, with its `variables`, for a pipeline of CI_SHA on the
    default branch."""
    table = world_addresses(world)
    for name, job in yaml.safe_load(block.text).items():
        # The project's CI/CD variables (the token masked), then GitLab's predefined ones.
        env = {"CONTROLPLANE_URL": substitute(CI_URL, table), "CONTROLPLANE_TOKEN": TOKEN}
        env.update({"CI_COMMIT_SHA": CI_SHA, "CI_COMMIT_BRANCH": "main"})
        env.update({"CI_DEFAULT_BRANCH": "main"})
        env.update({k: substitute(str(v), table) for k, v in (job.get("variables") or {}).items()})
        script = "\n".join(substitute(line, table) for line in job["script"])
        run_bash(script, world, env, f"{block.where}, job {name!r}")


@pytest.mark.parametrize("block", IN_ORDER, ids=[b.id for b in IN_ORDER])
def test_the_readme_commands_run_as_written(block: Block, world: World) -> None:
    published_before = world.complete_releases()

    kind = kind_of(block)
    if kind == "github-actions":
        run_github_actions(block, world)
    elif kind == "gitlab-ci":
        run_gitlab_ci(block, world)
    else:
        run_commands(block, world)

    # What a block publishes must deploy: a manifest that lists a temp file fails here.
    for store, model, release in sorted(world.complete_releases() - published_before):
        response = world.daemon_of(store).deploy(model, release)
        assert response.status_code == 200, (
            f"{block.where} published {model}/{release}, and the daemon refused it: {response.text}"
        )


# --- blocks that start servers --------------------------------------------------------------


def server_addresses(scratch: Path, triton: RunningTriton | None) -> dict[str, str]:
    """The README's paths and addresses in server blocks -> the test's."""
    table = {
        "/models/": f"{scratch}/models/",  # the pod's emptyDir
        "file:///mnt/model-store": (scratch / "model-store").as_uri(),
        "/usr/lib/x86_64-linux-gnu/": f"/usr/lib/{sysconfig.get_config_var('MULTIARCH')}/",
    }
    if triton is not None:  # Triton's default gRPC port -> the port the started one got
        table["localhost:8001"] = triton.grpc_url
    return table


@pytest.mark.parametrize("section", SERVER_SECTIONS, ids=[f"{p}#{s}" for p, s in SERVER_SECTIONS])
def test_the_readme_servers_start_and_stop_as_described(
    section: tuple[str, str], triton_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = [b for b in BLOCKS if (b.path, b.section) == section and b.marker is None]
    (tmp_path / "model-store").mkdir()
    with servers(tmp_path, triton_cache, monkeypatch) as running:
        for block in (b for b in blocks if kind_of(b) == SERVERS):
            exported: dict[str, str] = {}
            for command in block.commands():
                triton = running.tritons[-1] if running.tritons else None
                text = substitute(command.text, server_addresses(tmp_path, triton))
                if is_server(command.text):
                    running.start(text, exported)
                else:
                    exported.update(exports(text))
        running.stop_all()
    assert running.stopped
