"""``controlplane config --effective`` and the refusal of a typo, as the commands print them.

Each case runs the real command in a subprocess with a clean environment; nothing here binds a
port or reaches Triton (a settings error stops ``serve`` before either).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

EXIT_USAGE = 2
WRITE, READ = "wr1te-s3cret", "r3ad-s3cret"


def run(*args: str, cwd: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env.update(settings)
    return subprocess.run(
        [sys.executable, "-m", "controlplane", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_effective_prints_the_merged_settings_with_secrets_masked_and_their_sources(
    tmp_path: Path,
) -> None:
    config = tmp_path / "controlplane.yaml"
    config.write_text(
        "repository: {path: /srv/triton/repository}\n"
        "store: {uri: 'file:///srv/store', poll_interval_seconds: 3}\n"
        f"api: {{token: {WRITE}, port: 9000}}\n"
        "models: {resnet: {auto_deploy: true}}\n",
        encoding="utf-8",
    )

    result = run(
        "config",
        "--effective",
        "--config",
        str(config),
        cwd=tmp_path,
        CONTROLPLANE_API__PORT="9100",  # the environment wins over the file
        CONTROLPLANE_API__READ_TOKEN=READ,
    )

    assert result.returncode == 0, result.stderr
    assert WRITE not in result.stdout
    assert READ not in result.stdout
    effective = yaml.safe_load(result.stdout)
    assert effective["api"]["token"] == "********"
    assert effective["api"]["read_token"] == "********"
    assert effective["api"]["port"] == 9100
    assert effective["store"]["poll_interval_seconds"] == 3.0
    assert effective["store"]["retry_seconds"] == 120.0  # a default
    assert effective["models"]["resnet"]["auto_deploy"] is True
    lines = result.stdout.splitlines()
    assert "  port: 9100  # from CONTROLPLANE_API__PORT" in lines
    assert f"  poll_interval_seconds: 3.0  # from {config}" in lines
    assert f'  token: "********"  # from {config}' in lines
    assert '  read_token: "********"  # from CONTROLPLANE_API__READ_TOKEN' in lines
    assert "  retry_seconds: 120.0" in lines  # a default says nothing of where it came from
    assert "  path: null  # that is: /srv/triton/staging" in lines  # what null stands for


def test_effective_stays_local_with_controlplane_url_set(tmp_path: Path) -> None:
    """The shells that run client commands set CONTROLPLANE_URL; only --url asks the daemon."""
    result = run(
        "config",
        "--effective",
        cwd=tmp_path,
        CONTROLPLANE_URL="http://127.0.0.1:9",  # nothing answers: asking it would fail
        CONTROLPLANE_REPOSITORY__PATH="/srv/triton/repository",
        CONTROLPLANE_STORE__URI="file:///srv/store",
        CONTROLPLANE_API__TOKEN=WRITE,
    )

    assert result.returncode == 0, result.stderr
    assert '  token: "********"  # from CONTROLPLANE_API__TOKEN' in result.stdout.splitlines()


def test_effective_masks_the_password_of_every_url(tmp_path: Path) -> None:
    result = run(
        "config",
        "--effective",
        cwd=tmp_path,
        CONTROLPLANE_REPOSITORY__PATH="/srv/triton/repository",
        CONTROLPLANE_STORE__URI="file:///srv/store",
        CONTROLPLANE_ROLLBACK__SOURCE="prometheus",
        CONTROLPLANE_ROLLBACK__PROMETHEUS_URL="http://admin:hunter2@prom:9090",
        CONTROLPLANE_TRITON__METRICS_URL="https://scraper:s3cr@t%40hunter3@triton:8002/metrics",
        CONTROLPLANE_ROLLBACK__METRICS_URL="http://gpu:9400/metrics?job=dcgm&Access_Token=hunter4",
    )

    assert result.returncode == 0, result.stderr
    assert "hunter2" not in result.stdout
    assert "hunter3" not in result.stdout
    assert "hunter4" not in result.stdout
    assert "?job=dcgm&Access_Token=********" in result.stdout
    effective = yaml.safe_load(result.stdout)
    assert effective["rollback"]["prometheus_url"] == "http://admin:********@prom:9090"
    assert effective["triton"]["metrics_url"] == "https://scraper:********@triton:8002/metrics"
    lines = result.stdout.splitlines()
    assert (
        '  prometheus_url: "http://admin:********@prom:9090"  '
        "# from CONTROLPLANE_ROLLBACK__PROMETHEUS_URL"
    ) in lines
    # A null the daemon fills in with a URL says which, masked as well.
    assert (
        "  gpu_metrics_url: null  # that is: https://scraper:********@triton:8002/metrics"
    ) in lines


def test_serve_refuses_credentials_in_an_s3_uri_without_printing_them(tmp_path: Path) -> None:
    """S3 takes its credentials from the AWS chain; in the URI they would be logged with the
    start-up line and taken for part of the bucket's name."""
    result = run(
        "serve",
        cwd=tmp_path,
        CONTROLPLANE_REPOSITORY__PATH=str(tmp_path / "repository"),
        CONTROLPLANE_STORE__URI="s3://AKIAEXAMPLE:hunter2@models/releases",
        AWS_ENDPOINT_URL_S3="http://127.0.0.1:9",  # nothing listens: never a real S3
    )

    assert result.returncode == EXIT_USAGE, result.stderr
    assert "an S3 URI names the bucket only (s3://bucket/prefix)" in result.stderr
    assert "hunter2" not in result.stderr + result.stdout


def test_effective_refuses_what_serve_would_refuse(tmp_path: Path) -> None:
    result = run("config", "--effective", cwd=tmp_path)
    assert result.returncode == EXIT_USAGE
    assert "store.uri (CONTROLPLANE_STORE__URI): Field required" in result.stderr


def test_config_without_a_choice_says_what_to_ask_for(tmp_path: Path) -> None:
    result = run("config", cwd=tmp_path)
    assert result.returncode == EXIT_USAGE
    assert "--defaults" in result.stderr
    assert "--effective" in result.stderr


def test_serve_refuses_a_typo_naming_the_key_meant(tmp_path: Path) -> None:
    config = tmp_path / "controlplane.yaml"
    config.write_text(
        "repository: {path: /srv/triton/repository}\n"
        "store: {uri: 'file:///srv/store', poll_interval_secs: 3}\n",
        encoding="utf-8",
    )

    from_file = run("serve", "--config", str(config), cwd=tmp_path)
    from_env = run(
        "serve",
        cwd=tmp_path,
        CONTROLPLANE_REPOSITORY__PATH="/srv/triton/repository",
        CONTROLPLANE_STOR__URI="file:///srv/store",
    )

    assert from_file.returncode == EXIT_USAGE
    assert (
        f"store.poll_interval_secs (in {config}): there is no such setting; "
        "did you mean 'poll_interval_seconds'?"
    ) in from_file.stderr
    assert from_env.returncode == EXIT_USAGE
    assert (
        "CONTROLPLANE_STOR__URI: there is no settings group 'stor'; did you mean 'store' "
        "(CONTROLPLANE_STORE__URI)?"
    ) in from_env.stderr
