"""The read token beside the write token, against the real daemon: each token does what it is
for, from the headers alone, and neither is ever written to the log.

With ``api.read_token`` set, every read needs one of the two tokens (as a bearer token, or as
the password of HTTP Basic, any user name, for browsers), except the probes; a write needs the
write token, and the read token on a write is refused with 403 before the body is read."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from devtools.launcher import RunningTriton
from tests.support.daemon import Daemon, start_daemon
from tests.support.models import write_scale_release

pytestmark = pytest.mark.triton
WRITE, READ = "wr1te-token-for-tests", "r3ad-token-for-tests"
MODEL = "readable"
READS = [
    "/v1/models",
    f"/v1/models/{MODEL}",
    "/v1/operations",
    "/v1/alerts",
    "/v1/config",
    "/metrics",
    "/docs",
    "/openapi.json",
    "/",  # the status page
    "/ui/docs-assets/swagger-ui-bundle.js",
]
WRITES = [f"/v1/models/{MODEL}/deploy", f"/v1/models/{MODEL}/unload", "/v1/alerts"]
PROBES = ["/healthz", "/readyz"]
BASIC = 'Basic realm="controlplane"'


@pytest.fixture(scope="module")
def daemon(triton: RunningTriton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    workdir = tmp_path_factory.mktemp("read-token")
    store = workdir / "store"
    write_scale_release(store, MODEL, "r1", k=1.0)
    write_scale_release(store, MODEL, "r2", k=2.0)
    running = start_daemon(
        triton=triton,
        store=store,
        workdir=workdir,
        extra_env={"CONTROLPLANE_API__TOKEN": WRITE, "CONTROLPLANE_API__READ_TOKEN": READ},
    )
    running.headers.update(bearer(WRITE))
    try:
        assert running.deploy(MODEL, "r1").status_code == 200
        yield running
    finally:
        running.stop()


def call(daemon: Daemon, method: str, path: str, **kwargs: object) -> httpx.Response:
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        return client.request(method, path, **kwargs)  # type: ignore[arg-type]


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.mark.parametrize("path", READS)
@pytest.mark.parametrize("token", [READ, WRITE], ids=["read-token", "write-token"])
def test_either_token_reads(daemon: Daemon, path: str, token: str) -> None:
    response = call(daemon, "GET", path, headers=bearer(token))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("path", READS)
@pytest.mark.parametrize(
    "headers",
    [{}, bearer("not-a-token"), {"authorization": "Basic bm90OmF0b2tlbg=="}],
    ids=["none", "wrong-bearer", "wrong-basic"],
)
def test_a_read_without_a_token_is_401_with_the_challenge_a_browser_prompts_for(
    daemon: Daemon, path: str, headers: dict[str, str]
) -> None:
    response = call(daemon, "GET", path, headers=headers)

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert "api.read_token or api.token" in response.json()["error"]["message"]
    challenges = response.headers.get_list("www-authenticate")
    assert BASIC in challenges
    assert 'Bearer realm="controlplane"' in challenges


def test_a_head_without_a_token_is_401_too(daemon: Daemon) -> None:
    response = call(daemon, "HEAD", "/v1/models")
    assert response.status_code == 401
    assert BASIC in response.headers.get_list("www-authenticate")


@pytest.mark.parametrize("token", [READ, WRITE], ids=["read-token", "write-token"])
@pytest.mark.parametrize("path", ["/", "/v1/models", "/metrics", "/docs"])
def test_a_browser_reads_with_basic_auth_any_user_and_a_token_as_password(
    daemon: Daemon, token: str, path: str
) -> None:
    response = call(daemon, "GET", path, auth=("anyone", token))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("path", PROBES)
def test_the_probes_need_no_token(daemon: Daemon, path: str) -> None:
    assert call(daemon, "GET", path).status_code == 200


@pytest.mark.parametrize("path", WRITES)
def test_the_read_token_is_refused_on_writes_with_403_before_the_body_is_read(
    daemon: Daemon, path: str
) -> None:
    too_large = b'{"release": "' + b"x" * (2 * 1024 * 1024) + b'"}'  # 413 if it were read
    response = call(daemon, "POST", path, content=too_large, headers=bearer(READ))

    assert response.status_code == 403
    assert response.json()["error"] == {
        "code": "forbidden",
        "message": f"the read token (api.read_token) can only read: POST {path} needs the "
        "write token (api.token)",
    }
    assert "www-authenticate" not in response.headers


def test_the_write_token_writes(daemon: Daemon) -> None:
    response = call(
        daemon,
        "POST",
        f"/v1/models/{MODEL}/deploy",
        json={"release": "r2", "wait": True},
        headers=bearer(WRITE),
    )
    assert response.status_code == 200, response.text
    assert response.json()["operation"]["status"] == "succeeded"


@pytest.mark.parametrize(
    "headers",
    [{}, bearer("not-a-token")],
    ids=["none", "wrong-bearer"],
)
def test_a_write_without_the_write_token_is_401(daemon: Daemon, headers: dict[str, str]) -> None:
    response = call(daemon, "POST", "/v1/alerts", json={"alerts": []}, headers=headers)
    assert response.status_code == 401
    assert response.headers.get_list("www-authenticate") == ['Bearer realm="controlplane"']


def test_a_write_takes_no_basic_auth_even_with_the_write_token(daemon: Daemon) -> None:
    # A browser sends Basic credentials it was given by itself, also with a request another
    # site's page makes: writes take the bearer token only.
    response = call(daemon, "POST", "/v1/alerts", json={"alerts": []}, auth=("any", WRITE))
    assert response.status_code == 401
    assert "not as HTTP Basic" in response.json()["error"]["message"]


def test_a_fleet_wake_needs_no_token(daemon: Daemon) -> None:
    assert call(daemon, "POST", "/v1/fleet/wake").status_code == 202


def cli(daemon: Daemon, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env.update({"CONTROLPLANE_URL": daemon.url, "CONTROLPLANE_TOKEN": token})
    return subprocess.run(
        [sys.executable, "-m", "controlplane", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_cli_reads_with_the_read_token_and_is_refused_a_write(daemon: Daemon) -> None:
    status = cli(daemon, READ, "status", MODEL)
    deploy = cli(daemon, READ, "deploy", MODEL, "r1")
    fleet = cli(daemon, READ, "fleet")
    anonymous = cli(daemon, "", "status")

    assert status.returncode == 0, status.stderr
    assert f"{MODEL}\n  active:    r" in status.stdout
    assert fleet.returncode == 0, fleet.stderr
    assert deploy.returncode == 1
    assert "error: forbidden: the read token (api.read_token) can only read" in deploy.stderr
    assert anonymous.returncode == 1
    assert "error: unauthorized" in anonymous.stderr


def test_no_token_is_ever_logged(daemon: Daemon) -> None:
    call(daemon, "GET", "/v1/models", headers=bearer(READ + "x"))
    call(daemon, "POST", "/v1/alerts", headers=bearer(READ))
    log = daemon.log()
    assert READ not in log
    assert WRITE not in log
