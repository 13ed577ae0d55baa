"""Releases signed with OpenSSF Model Signing (``model.sig``) end to end: signed by running the
real ``model_signing`` CLI, with EC keys and a test CA made here, deployed by a daemon on the
real Triton from a local store and from moto's S3 server.

A refusal costs no load (it comes before anything is placed), so the cases share a daemon and
each checks that the serving release still answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory
from tests.integration.test_signatures import answers, operations_of, publish, watcher_saw
from tests.support.daemon import Daemon
from tests.support.fault_proxy import FaultProxy
from tests.support.model_signing import EcKey, make_ca, make_ec_key
from tests.support.models import write_scale_release, write_sha256sums
from tests.support.polling import eventually
from tests.support.s3 import aws_env, upload_release_dir
from tests.support.s3_fixtures import fault_proxy, moto_endpoint, s3_bucket  # noqa: F401
from tests.support.signing import make_key

pytestmark = pytest.mark.triton
PREFIX = "models"


def unsummed(build_dir: Path, model: str, release: str, k: float) -> Path:
    """A release as Model Signing publishes it: its files and no ``SHA256SUMS``."""
    release_dir = write_scale_release(build_dir, model, release, k=k)
    (release_dir / "SHA256SUMS").unlink()
    return release_dir


def refused(
    daemon: Daemon, model: str, release: str, code: str, said: str, status: int = 422
) -> dict[str, Any]:
    response = daemon.deploy(model, release)
    assert response.status_code == status, (release, response.text)
    error: dict[str, Any] = response.json()["error"]
    assert (release, error["code"]) == (release, code), error
    assert said in error["message"], (release, error["message"])
    return error


def test_model_sig_releases_deploy_with_their_signer_and_forged_ones_are_refused(
    daemons: DaemonFactory, tmp_path: Path, model_name: str, triton: RunningTriton
) -> None:
    store, builds, private, ring = (tmp_path / n for n in ("store", "build", "keys", "ring"))
    store.mkdir()
    publisher = make_ec_key(private, "publisher")  # P-256
    big = make_ec_key(private, "big", "p384")
    stranger = make_ec_key(private, "stranger")
    publisher.public_pem(ring / "publisher.pem")
    big.public_pem(ring / "big.pem")
    ca, unknown_ca = make_ca(tmp_path / "pki", "Test CA"), make_ca(tmp_path / "pki", "Other CA")
    ca.pem(ring / "ca" / "test-ca.pem")  # certificate mode: a CA of the keyring
    ci = ca.issue("ci-publisher")
    alpha = make_key(private, "alpha")  # openssl's Ed25519, for SHA256SUMS.sig
    alpha.public_pem(ring / "alpha.pem")
    model = model_name
    daemon = daemons(store, config=f"store:\n  require_signature: true\n  keyring: {ring}\n")

    # Key mode, then certificate mode: each deploys with no SHA256SUMS, its signer recorded.
    for release, k, signer, sign in [
        ("r1", 1.0, "publisher", publisher.sign),
        ("r2", 2.0, ci.subject, ci.sign),
    ]:
        release_dir = unsummed(builds, model, release, k)
        sign(release_dir)
        publish(release_dir, store)
        response = daemon.deploy(model, release)
        assert response.status_code == 200, response.text
        operation = response.json()["operation"]
        assert operation["detail"]["signer"] == signer
        step = next(s for s in operation["steps"] if s["name"] == "signature")
        assert step["detail"] == {"signed": True, "signer": signer, "signed_with": ["model.sig"]}
        names = [s["name"] for s in operation["steps"]]
        assert names[:4] == ["resolve", "signature", "fetch", "verify"], names
        fetch = next(s for s in operation["steps"] if s["name"] == "fetch")
        assert fetch["detail"]["files"] == 2  # config.pbtxt, 1/model.py: model.sig stays out
        assert daemon.get(f"/v1/models/{model}").json()["signer"] == signer
        assert answers(triton, model) == k
    assert not list(daemon.repository.glob(f"{model}*/model.sig")), "model.sig reached Triton"

    # A file changed after signing, a stranger's key, a CA the keyring lacks: each refused with
    # its code while r2 keeps serving.
    tampered = unsummed(builds, model, "r3", 3.0)
    publisher.sign(tampered)
    (tampered / "1" / "model.py").write_text("# edited after signing\n", encoding="utf-8")
    publish(tampered, store)
    stranger.sign(publish(unsummed(builds, model, "r4", 4.0), store))
    unknown_ca.issue("intruder").sign(publish(unsummed(builds, model, "r5", 5.0), store))
    publish(unsummed(builds, model, "r6", 6.0), store)  # no signature at all
    cases = [
        ("r3", 422, "checksum_mismatch", "1 file(s) do not match model.sig: 1/model.py"),
        ("r4", 422, "signature_invalid", "does not verify with any EC key of the keyring"),
        ("r5", 422, "signature_invalid", "leads to no CA of the keyring's ca/ (CAs: test-ca)"),
        ("r6", 409, "release_incomplete", "has no SHA256SUMS (nor model.sig)"),
    ]
    for release, status, code, said in cases:
        refused(daemon, model, release, code, said, status)
        view = daemon.get(f"/v1/models/{model}").json()
        assert (view["active_release"], view["signer"]) == ("r2", ci.subject)
        assert answers(triton, model) == 2.0
    assert daemon.staging_leftovers() == []

    # Both model.sig and SHA256SUMS.sig: checked against both, each signer recorded.
    def both(release: str, k: float, sums_key: Any, model_key: EcKey) -> Path:
        release_dir = unsummed(builds, model, release, k)
        model_key.sign(release_dir)  # before SHA256SUMS: it lists the model's files only
        (release_dir / "model.sig").rename(builds / f"{release}.model.sig")
        write_sha256sums(release_dir)
        sums_key.sign(release_dir / "SHA256SUMS", model, release)
        (builds / f"{release}.model.sig").rename(release_dir / "model.sig")
        return publish(release_dir, store)

    both("r7", 7.0, alpha, big)
    response = daemon.deploy(model, "r7")
    assert response.status_code == 200, response.text
    operation = response.json()["operation"]
    assert operation["detail"]["signer"] == "big, alpha"
    step = next(s for s in operation["steps"] if s["name"] == "signature")
    assert step["detail"]["signed_with"] == ["model.sig", "SHA256SUMS.sig"]
    assert answers(triton, model) == 7.0

    stranger_ssl = make_key(private, "stranger-ssl")
    both("r8", 8.0, stranger_ssl, big)  # SHA256SUMS.sig broken, model.sig good
    both("r9", 9.0, alpha, stranger)  # model.sig broken, SHA256SUMS.sig good
    # Both signatures good, but SHA256SUMS written (and signed) after a file changed.
    drifted = both("r10", 10.0, alpha, big)
    (drifted / "1" / "model.py").write_text("# changed after model.sig\n", encoding="utf-8")
    write_sha256sums(drifted)
    (drifted / "SHA256SUMS.sig").unlink()
    alpha.sign(drifted / "SHA256SUMS", model, "r10")

    # Signed with model_signing after SHA256SUMS and its .sig were written: model.sig lists
    # them too, and they must be the ones published.
    def signed_last(release: str, k: float) -> Path:
        release_dir = unsummed(builds, model, release, k)
        write_sha256sums(release_dir)
        alpha.sign(release_dir / "SHA256SUMS", model, release)
        big.sign(release_dir)
        return publish(release_dir, store)

    signed_last("r11", 11.0)
    response = daemon.deploy(model, "r11")
    assert response.status_code == 200, response.text
    assert answers(triton, model) == 11.0
    assert not list(daemon.repository.glob(f"{model}*/SHA256SUMS.sig"))
    resigned = signed_last("r12", 12.0)  # its SHA256SUMS.sig replaced by another key's
    beta = make_key(private, "beta")
    beta.public_pem(ring / "beta.pem")
    beta.sign(resigned / "SHA256SUMS", model, "r12", out=builds / "r12.sig")
    (builds / "r12.sig").rename(resigned / "SHA256SUMS.sig")
    for release, said in [
        ("r8", "SHA256SUMS.sig of release 'r8'"),
        ("r9", "model.sig of release 'r9' of"),
        ("r10", "SHA256SUMS and model.sig of release 'r10'"),
        ("r12", "lists SHA256SUMS.sig with a digest its SHA256SUMS.sig does not have"),
    ]:
        refused(daemon, model, release, "signature_invalid", said)
        assert daemon.get(f"/v1/models/{model}").json()["active_release"] == "r11"
        assert answers(triton, model) == 11.0
    metrics = daemon.get("/metrics").text
    assert 'controlplane_signature_refusals_total{code="signature_invalid"} 6.0' in metrics


def test_on_s3_model_sig_is_read_first_and_a_refused_release_fetches_nothing_else(
    daemons: DaemonFactory,
    tmp_path: Path,
    s3_bucket: tuple[Any, str],  # noqa: F811
    fault_proxy: FaultProxy,  # noqa: F811
    model_name: str,
    triton: RunningTriton,
) -> None:
    client, bucket = s3_bucket
    builds, private, ring = tmp_path / "build", tmp_path / "keys", tmp_path / "ring"
    publisher, stranger = make_ec_key(private, "publisher"), make_ec_key(private, "stranger")
    publisher.public_pem(ring / "publisher.pem")
    daemon = daemons(
        tmp_path,
        store_uri=f"s3://{bucket}/{PREFIX}",
        extra_env=aws_env(fault_proxy.endpoint),  # the daemon's requests seen by the proxy
        config=f"store:\n  keyring: {ring}\n  require_signature: true\n"
        "  poll_interval_seconds: 0.5\n"
        f"models:\n  {model_name}:\n    auto_deploy: true\n",
    )
    # model.sig is the release's marker: uploaded last, the watcher finds it complete.
    r1 = unsummed(builds, model_name, "r1", 1.0)
    publisher.sign(r1)
    upload_release_dir(client, bucket, PREFIX, r1)
    eventually(lambda: answers(triton, model_name) == 1.0, 60, "the model.sig r1 auto-deployed")
    eventually(
        lambda: daemon.get(f"/v1/models/{model_name}").json()["signer"] == "publisher",
        30,
        "the deploy of r1 recorded",
    )
    [first] = operations_of(daemon, model_name)
    assert first["trigger"] == "watcher"
    releases = daemon.get(f"/v1/models/{model_name}").json()["releases"]
    assert releases == [{"name": "r1", "complete": True, "signed": True}]

    # Signed by a stranger: tried, refused before any file of it is fetched.
    r2 = unsummed(builds, model_name, "r2", 2.0)
    stranger.sign(r2)
    upload_release_dir(client, bucket, PREFIX, r2)
    eventually(watcher_saw(daemon, model_name, "r2"), 30, "the watcher listing r2")

    def failed() -> bool:
        ops = [op for op in operations_of(daemon, model_name) if op["release"] == "r2"]
        return bool(ops) and ops[0]["status"] == "failed"

    eventually(failed, 30, "the forged r2 refused")
    [op] = [op for op in operations_of(daemon, model_name) if op["release"] == "r2"]
    assert op["error"]["code"] == "signature_invalid"
    assert [s["name"] for s in op["steps"]] == ["resolve", "signature"]
    # What the daemon read of r2: model.sig first, then the other markers (absent), and no
    # listing of its files nor any file of it: the refusal cost no download.
    base = f"/{bucket}/{PREFIX}/{model_name}/r2/"
    seen = fault_proxy.requests
    gets = [s.path[len(base) :] for s in seen if s.method == "GET" and s.path.startswith(base)]
    assert gets[0] == "model.sig", gets
    assert set(gets) == {"model.sig", "SHA256SUMS", "SHA256SUMS.sig"}, gets
    listings = [s.query for s in seen if f"prefix={PREFIX}/{model_name}/r2/" in s.query]
    assert listings == [], listings
    assert daemon.get(f"/v1/models/{model_name}").json()["active_release"] == "r1"
    assert answers(triton, model_name) == 1.0
    assert daemon.staging_leftovers() == []
