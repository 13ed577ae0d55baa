"""Release signatures end to end: releases signed by the openssl binary, a daemon that checks
them against a keyring, the real Triton, a local store and moto's S3 server.

One daemon per store, many releases each: a refusal costs no load (it comes before anything is
fetched), so the cases share a daemon and each checks that the serving release still answers
through the model's name.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory
from tests.integration.test_cli import cli
from tests.support.daemon import Daemon
from tests.support.inference import infer_once
from tests.support.models import write_scale_release, write_sha256sums
from tests.support.polling import eventually
from tests.support.s3 import aws_env, upload_release_dir
from tests.support.s3_fixtures import moto_endpoint, s3_bucket  # noqa: F401
from tests.support.signing import PublisherKey, make_key

pytestmark = pytest.mark.triton
PREFIX = "models"


def build(build_dir: Path, model: str, release: str, k: float, key: PublisherKey | None) -> Path:
    """A release written and (when ``key`` is given) signed outside the store."""
    release_dir = write_scale_release(build_dir, model, release, k=k)
    if key is not None:
        key.sign(release_dir / "SHA256SUMS", model, release)
    return release_dir


def publish(release_dir: Path, store: Path) -> Path:
    """Into the local store in one rename: the release appears whole, signature and all."""
    target = store / release_dir.parent.name / release_dir.name
    target.parent.mkdir(parents=True, exist_ok=True)
    os.rename(release_dir, target)
    return target


def answers(triton: RunningTriton, model: str) -> float | None:
    try:
        return infer_once(triton.grpc_url, model)
    except Exception:  # not loaded (yet)
        return None


def operations_of(daemon: Daemon, model: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = daemon.get(f"/v1/operations?model={model}&limit=50").json()[
        "operations"
    ]
    return found


def listed(daemon: Daemon, model: str) -> dict[str, Any] | None:
    """The model as GET /v1/models shows it: from the watcher's last look at the store."""
    for view in daemon.get("/v1/models").json()["models"]:
        if view["name"] == model:
            return dict(view)
    return None


def watcher_saw(daemon: Daemon, model: str, release: str) -> Callable[[], bool]:
    def check() -> bool:
        view = listed(daemon, model)
        return view is not None and any(
            r["name"] == release and r["complete"] for r in view["releases"]
        )

    return check


def test_signed_releases_deploy_with_their_signer_and_bad_ones_are_refused(
    daemons: DaemonFactory, tmp_path: Path, model_name: str, triton: RunningTriton
) -> None:
    store, builds, private, keyring = (tmp_path / n for n in ("store", "build", "keys", "ring"))
    store.mkdir()
    alpha, beta = make_key(private, "alpha"), make_key(private, "beta", "p256")
    alpha.public_pem(keyring / "alpha.pem")
    beta.public_pem(keyring / "beta.pem")
    lapsed, gamma = make_key(private, "lapsed"), make_key(private, "gamma", "p256")
    lapsed.certificate(keyring / "lapsed.pem", days=-1)  # notAfter in the past
    gamma.public_pem(keyring / "retired" / "gamma.pem")
    stranger = make_key(private, "stranger")
    model, auto, unsigned_ok = model_name, f"{model_name}-auto", f"{model_name}-open"
    publish(build(builds, auto, "r1", 1.0, alpha), store)
    daemon = daemons(
        store,
        config=f"store:\n  require_signature: true\n  keyring: {keyring}\n"
        "  poll_interval_seconds: 0.5\n"
        f"models:\n  {auto}:\n    auto_deploy: true\n"
        f"  {unsigned_ok}:\n    require_signature: false\n",
    )

    # Ed25519 and ECDSA P-256, each key of the two may sign.
    for release, k, key in [("r1", 1.0, alpha), ("r2", 2.0, beta)]:
        publish(build(builds, model, release, k, key), store)
        response = daemon.deploy(model, release)
        assert response.status_code == 200, response.text
        operation = response.json()["operation"]
        assert operation["detail"]["signer"] == key.name
        signature = next(s for s in operation["steps"] if s["name"] == "signature")
        assert signature["detail"] == {"signed": True, "signer": key.name}
        names = [s["name"] for s in operation["steps"]]
        assert names[:4] == ["resolve", "signature", "fetch", "verify"], names
        assert daemon.get(f"/v1/models/{model}").json()["signer"] == key.name
        assert answers(triton, model) == k
    shown = cli(daemon.url, "status", model)
    assert shown.returncode == 0, shown.stderr
    assert "signed by: beta" in shown.stdout
    shown = cli(daemon.url, "operations", operation["id"])
    assert "signed by: beta" in shown.stdout, shown.stdout

    # Each refused with its code while r2 keeps serving.
    tampered = build(builds, model, "r3", 3.0, alpha)
    (tampered / "1" / "model.py").write_text("# edited after signing\n", encoding="utf-8")
    write_sha256sums(tampered)  # a SHA256SUMS that matches the files, but not its signature
    publish(tampered, store)
    publish(build(builds, model, "r4", 4.0, None), store)  # no .sig
    publish(build(builds, model, "r5", 5.0, stranger), store)  # a key the keyring lacks
    publish(build(builds, model, "r6", 6.0, lapsed), store)  # its certificate expired
    publish(build(builds, model, "r7", 7.0, gamma), store)  # a retired key
    other = publish(build(builds, model, "r8", 8.0, None), store)
    shutil.copy(store / model / "r2" / "SHA256SUMS.sig", other / "SHA256SUMS.sig")
    # Write access to the store is enough to copy a signed release whole under another
    # release name, or another model's: its signature names where it was published.
    shutil.copytree(store / model / "r2", store / model / "r10")
    copied = f"{model}-copy"
    shutil.copytree(store / model / "r2", store / copied / "r2")
    unbound = build(builds, model, "r11", 11.0, None)
    alpha.sign_unbound(unbound / "SHA256SUMS")  # over SHA256SUMS alone: the old way
    publish(unbound, store)
    for name, release, code, said in [
        (model, "r3", "signature_invalid", "changed after it was signed"),
        (model, "r4", "signature_missing", "has no SHA256SUMS.sig"),
        (model, "r5", "signature_invalid", "a key the keyring does not hold"),
        (model, "r6", "unknown_signer", "key 'lapsed' expired on"),
        (model, "r7", "unknown_signer", "key 'gamma' is retired"),
        (model, "r8", "signature_invalid", "trusted keys: alpha, beta"),
        (model, "r10", "signature_invalid", "signed for another model or release"),
        (copied, "r2", "signature_invalid", "signed for another model or release"),
        (model, "r11", "signature_unbound", "over SHA256SUMS alone (by key 'alpha'), the old"),
    ]:
        response = daemon.deploy(name, release)
        assert response.status_code == 422, (release, response.text)
        error = response.json()["error"]
        assert (error["code"], release) == (code, release), error
        assert said in error["message"], (release, error["message"])
        view = daemon.get(f"/v1/models/{model}").json()
        assert (view["active_release"], view["signer"]) == ("r2", "beta")
        assert answers(triton, model) == 2.0
    assert daemon.get(f"/v1/models/{copied}").json()["active_release"] is None
    assert answers(triton, copied) is None
    # The message of the old way says how to sign it again; done so, it deploys.
    message = daemon.deploy(model, "r11").json()["error"]["message"]
    assert f"' {model} r11; cat SHA256SUMS; }} > /tmp/statement" in message, message
    alpha.sign(store / model / "r11" / "SHA256SUMS", model, "r11", out=builds / "r11.sig")
    os.rename(builds / "r11.sig", store / model / "r11" / "SHA256SUMS.sig")
    response = daemon.deploy(model, "r11")
    assert response.status_code == 200, response.text
    assert answers(triton, model) == 11.0
    assert daemon.staging_leftovers() == []
    metrics = daemon.get("/metrics").text
    assert 'controlplane_signature_refusals_total{code="signature_invalid"} 5.0' in metrics
    assert 'controlplane_signature_refusals_total{code="signature_unbound"} 2.0' in metrics
    assert 'controlplane_signature_refusals_total{code="unknown_signer"} 2.0' in metrics

    # A key added to the keyring dir while the daemon runs is used at once.
    delta = make_key(private, "delta")
    publish(build(builds, model, "r9", 9.0, delta), store)
    assert daemon.deploy(model, "r9").json()["error"]["code"] == "signature_invalid"
    delta.public_pem(keyring / "delta.pem")
    response = daemon.deploy(model, "r9")
    assert response.status_code == 200, response.text
    assert daemon.get(f"/v1/models/{model}").json()["signer"] == "delta"
    assert answers(triton, model) == 9.0

    # Where no signature is required, an unsigned release deploys as it always did.
    publish(build(builds, unsigned_ok, "r1", 1.0, None), store)
    response = daemon.deploy(unsigned_ok, "r1")
    assert response.status_code == 200, response.text
    assert "signer" not in response.json()["operation"]["detail"]

    # Auto-deploy: a signed release is deployed, an unsigned newer one never is.
    eventually(lambda: answers(triton, auto) == 1.0, 60, "the signed r1 auto-deployed")
    [first] = operations_of(daemon, auto)
    assert (first["trigger"], first["detail"]["signer"]) == ("watcher", "alpha")
    publish(build(builds, auto, "r2", 2.0, None), store)
    eventually(watcher_saw(daemon, auto, "r2"), 30, "the watcher listing the unsigned r2")
    eventually(lambda: "not auto-deploying" in daemon.log(), 10, "the hold logged")
    assert [op["release"] for op in operations_of(daemon, auto)] == ["r1"]
    assert daemon.get(f"/v1/models/{auto}").json()["active_release"] == "r1"
    assert answers(triton, auto) == 1.0
    assert daemon.log().count(f"not auto-deploying {auto} r2") == 1

    # Its signature uploaded after SHA256SUMS (the wrong order): then it is deployed.
    held = store / auto / "r2"
    alpha.sign(held / "SHA256SUMS", auto, "r2", out=builds / "r2.sig")
    os.rename(builds / "r2.sig", held / "SHA256SUMS.sig")
    eventually(lambda: answers(triton, auto) == 2.0, 60, "r2 auto-deployed once signed")
    assert [(op["release"], op["detail"].get("signer")) for op in operations_of(daemon, auto)] == [
        ("r2", "alpha"),
        ("r1", "alpha"),
    ]
    assert daemon.log().count(f"not auto-deploying {auto} r2") == 1


def test_on_s3_a_signed_release_auto_deploys_and_an_unsigned_or_forged_one_does_not(
    daemons: DaemonFactory,
    tmp_path: Path,
    s3_bucket: tuple[Any, str],  # noqa: F811
    moto_endpoint: str,  # noqa: F811
    model_name: str,
    triton: RunningTriton,
) -> None:
    client, bucket = s3_bucket
    builds, private, keyring = tmp_path / "build", tmp_path / "keys", tmp_path / "ring"
    publisher = make_key(private, "publisher", "p256")
    pem = publisher.public_pem(keyring / "publisher.pem")
    daemon = daemons(
        tmp_path,
        store_uri=f"s3://{bucket}/{PREFIX}",
        extra_env=aws_env(moto_endpoint),
        # A list of PEM files, and the requirement set for this model alone.
        config=f'store:\n  keyring: ["{pem}"]\n  poll_interval_seconds: 0.5\n'
        f"models:\n  {model_name}:\n    auto_deploy: true\n    require_signature: true\n",
    )
    r1 = build(builds, model_name, "r1", 1.0, publisher)
    upload_release_dir(client, bucket, PREFIX, r1)  # SHA256SUMS.sig before SHA256SUMS
    eventually(lambda: answers(triton, model_name) == 1.0, 60, "the signed r1 auto-deployed")

    def view() -> dict[str, Any]:
        found: dict[str, Any] = daemon.get(f"/v1/models/{model_name}").json()
        return found

    # The signer of what serves is the succeeded deploy's: the operation ends after the switch.
    eventually(lambda: view()["signer"] == "publisher", 30, "the deploy of r1 recorded")
    assert view()["active_release"] == "r1"
    assert [r["signed"] for r in view()["releases"]] == [True]

    upload_release_dir(client, bucket, PREFIX, build(builds, model_name, "r2", 2.0, None))
    eventually(watcher_saw(daemon, model_name, "r2"), 30, "the watcher listing the unsigned r2")
    eventually(lambda: f"not auto-deploying {model_name} r2" in daemon.log(), 10, "hold logged")
    assert [op["release"] for op in operations_of(daemon, model_name)] == ["r1"]
    assert answers(triton, model_name) == 1.0

    # Signed, but over another release's SHA256SUMS: tried, refused, r1 keeps serving.
    forged = build(builds, model_name, "r3", 3.0, None)
    shutil.copy(r1 / "SHA256SUMS.sig", forged / "SHA256SUMS.sig")
    upload_release_dir(client, bucket, PREFIX, forged)

    def refused() -> bool:
        ops = [op for op in operations_of(daemon, model_name) if op["release"] == "r3"]
        return bool(ops) and ops[0]["status"] == "failed"

    eventually(refused, 30, "the forged r3 refused")
    [op] = [op for op in operations_of(daemon, model_name) if op["release"] == "r3"]
    assert op["error"]["code"] == "signature_invalid"
    assert [s["name"] for s in op["steps"]] == ["resolve", "signature"]  # nothing fetched
    response = daemon.deploy(model_name, "r2")
    assert response.json()["error"]["code"] == "signature_missing"
    assert view()["active_release"] == "r1"
    assert answers(triton, model_name) == 1.0
