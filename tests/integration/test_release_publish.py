"""The publisher's commands as a CI job runs them (`controlplane release check|publish`, real
processes), against the real daemon and Triton, a directory store and moto's S3 server:
a check refuses what a deploy refuses, with the same code and message; a published release
deploys and serves; a publish cut in the middle leaves no marker, so no member takes the
release, and running it again completes it; a published release is never overwritten."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory
from tests.support.daemon import Daemon
from tests.support.fault_proxy import FaultProxy
from tests.support.inference import infer_once
from tests.support.model_signing import make_ec_key, model_signing
from tests.support.models import corrupt_file, write_scale_release, write_sha256sums
from tests.support.s3 import aws_env
from tests.support.s3_fixtures import fault_proxy, moto_endpoint, s3_bucket  # noqa: F401
from tests.support.signing import make_key

pytestmark = pytest.mark.triton
PREFIX = "models"
EXIT_FAILED = 1
MIB = 1024 * 1024


def controlplane(
    *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CONTROLPLANE_", "AWS_"))}
    return subprocess.run(
        [sys.executable, "-m", "controlplane", *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def document(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(result.stdout)


def serves(triton: RunningTriton, model: str, k: float) -> bool:
    return infer_once(triton.grpc_url, model) == k


# --- release check: the deploy's refusals, word for word -----------------------------------


def _corrupt(path: Path) -> None:
    corrupt_file(path)


def _symlink(path: Path) -> None:
    (path / "1" / "weights.bin").symlink_to(path / "config.pbtxt")


def _unlisted(path: Path) -> None:
    (path / "1" / "extra.bin").write_bytes(b"not listed")


def _missing(path: Path) -> None:
    (path / "config.pbtxt").unlink()


def _dotdot(path: Path) -> None:
    with (path / "SHA256SUMS").open("a", encoding="utf-8") as out:
        out.write(f"{'0' * 64}  ../escape.py\n")


def _bad_config(path: Path) -> None:
    (path / "config.pbtxt").write_text('backend: "python"\nno_such_field: 1\n', encoding="utf-8")
    write_sha256sums(path)


def _bad_memory_hint(path: Path) -> None:
    with (path / "config.pbtxt").open("a", encoding="utf-8") as out:
        out.write(
            'parameters { key: "controlplane.memory_hint_bytes" value { string_value: "lots" } }\n'
        )
    write_sha256sums(path)


def _syntax_error(path: Path) -> None:
    with (path / "1" / "model.py").open("a", encoding="utf-8") as out:
        out.write("def broken(:\n")
    write_sha256sums(path)


def _bad_smoke(path: Path) -> None:
    (path / "smoke.json").write_text('{"inputs": {"INPUT0": {"datatype": "FP99"}}}')
    write_sha256sums(path)


BREAKAGES: dict[str, Callable[[Path], None]] = {
    "checksum_mismatch": _corrupt,
    "checksum_mismatch-missing": _missing,
    "invalid_release-symlink": _symlink,
    "invalid_release-unlisted": _unlisted,
    "invalid_release-dotdot": _dotdot,
    "invalid_release-python": _syntax_error,
    "invalid_model_config-schema": _bad_config,
    "invalid_model_config-hint": _bad_memory_hint,
    "preflight_failed-smoke": _bad_smoke,
}


def test_release_check_refuses_what_a_deploy_refuses_with_the_same_code_and_message(
    daemons: DaemonFactory, tmp_path: Path, model_name: str, triton: RunningTriton
) -> None:
    store = tmp_path / "store"
    good = write_scale_release(store, model_name, "good", k=2.0)
    assert controlplane("release", "check", str(good)).returncode == 0
    for number, breakage in enumerate(BREAKAGES.values()):
        breakage(write_scale_release(store, model_name, f"r{number}", k=2.0))
    daemon = daemons(store)

    for number, name in enumerate(BREAKAGES):
        release = f"r{number}"
        path = store / model_name / release
        checked = controlplane(
            "release", "check", str(path), "--model", model_name, "--release", release,
            "-o", "json",
        )  # fmt: skip
        deployed = daemon.deploy(model_name, release)

        assert checked.returncode == EXIT_FAILED, (name, checked.stdout, checked.stderr)
        assert deployed.status_code >= 400, (name, deployed.text)
        assert document(checked)["error"] == deployed.json()["error"], name
        assert document(checked)["error"]["code"] == name.split("-")[0]

    assert daemon.deploy(model_name, "good").status_code == 200
    assert serves(triton, model_name, 2.0)  # every refusal left nothing behind


def test_release_check_with_a_keyring_refuses_signatures_as_a_member_does(
    daemons: DaemonFactory, tmp_path: Path, model_name: str, triton: RunningTriton
) -> None:
    store, keyring = tmp_path / "store", tmp_path / "ring"
    trusted = make_key(tmp_path / "keys", "trusted")
    stranger = make_key(tmp_path / "keys", "stranger")
    trusted.public_pem(keyring / "trusted.pem")
    retired = make_key(tmp_path / "keys", "retired")
    retired.public_pem(keyring / "retired" / "retired.pem")
    cases: dict[str, Callable[[Path], object]] = {
        "signature_missing": lambda sums: None,
        "signature_invalid": lambda sums: stranger.sign(sums, model_name, "signature_invalid"),
        "signature_unbound": lambda sums: trusted.sign_unbound(sums),
        "unknown_signer": lambda sums: retired.sign(sums, model_name, "unknown_signer"),
    }
    for code, sign in cases.items():
        sign(write_scale_release(store, model_name, code, k=1.0) / "SHA256SUMS")
    signed = write_scale_release(store, model_name, "good", k=6.0)
    trusted.sign(signed / "SHA256SUMS", model_name, "good")
    daemon = daemons(store, config=f"store:\n  require_signature: true\n  keyring: {keyring}\n")

    for code in cases:
        checked = controlplane(
            "release", "check", str(store / model_name / code), "--model", model_name,
            "--release", code, "--keyring", str(keyring), "--require-signature", "-o", "json",
        )  # fmt: skip
        deployed = daemon.deploy(model_name, code)

        assert checked.returncode == EXIT_FAILED, (code, checked.stdout, checked.stderr)
        assert document(checked)["error"] == deployed.json()["error"], code
        assert document(checked)["error"]["code"] == code

    good = controlplane(
        "release", "check", str(signed), "--model", model_name, "--release", "good",
        "--keyring", str(keyring), "--require-signature", "-o", "json",
    )  # fmt: skip
    assert good.returncode == 0, good.stdout
    assert document(good)["steps"][0] == {
        "name": "signature",
        "status": "succeeded",
        "detail": {"signed": True, "signer": "trusted"},
    }
    assert daemon.deploy(model_name, "good").status_code == 200
    assert serves(triton, model_name, 6.0)


def test_release_check_refuses_a_name_a_deploy_refuses(
    daemons: DaemonFactory, tmp_path: Path, triton: RunningTriton
) -> None:
    build = write_scale_release(tmp_path / "build", "m", "r1", k=1.0, checksums=False)
    (tmp_path / "store").mkdir()
    daemon = daemons(tmp_path / "store")

    checked = controlplane("release", "check", str(build), "--release", "r.._1", "-o", "json")
    deployed = daemon.deploy("m", "r.._1")

    assert checked.returncode == 2
    assert checked.stdout == ""
    assert deployed.json()["error"]["code"] == "invalid_name"
    assert deployed.json()["error"]["message"] in checked.stderr


# --- release publish -------------------------------------------------------------------------


def test_a_release_published_to_a_directory_store_deploys_and_serves(
    daemons: DaemonFactory, tmp_path: Path, model_name: str, triton: RunningTriton
) -> None:
    """Signed with --sign, verified by a member that requires signatures."""
    store, keyring = tmp_path / "store", tmp_path / "ring"
    store.mkdir()
    key = make_key(tmp_path / "keys", "ci-key", "p256")
    key.public_pem(keyring / "ci-key.pem")
    daemon = daemons(store, config=f"store:\n  require_signature: true\n  keyring: {keyring}\n")
    build = write_scale_release(tmp_path / "build", "any", "thing", k=3.0, checksums=False)
    where = f"{store}/{model_name}/r1"

    published = controlplane("release", "publish", str(build), where, "--sign", str(key.private))

    assert published.returncode == 0, published.stderr
    deployed = daemon.deploy(model_name, "r1")
    assert deployed.status_code == 200, deployed.text
    assert deployed.json()["operation"]["detail"]["signer"] == "ci-key"
    assert serves(triton, model_name, 3.0)
    again = controlplane("release", "publish", str(build), where, "--sign", str(key.private))
    assert again.returncode == EXIT_FAILED
    assert "error: release_exists: release 'r1' of model" in again.stderr


def test_a_release_signed_with_model_signing_is_checked_published_and_deployed(
    daemons: DaemonFactory, tmp_path: Path, model_name: str, triton: RunningTriton
) -> None:
    """A dir as NGC ships it (its files and ``model.sig``): the check verifies it, the publish
    writes a SHA256SUMS that lists the files but not model.sig, and uploads model.sig after
    every file (a member hears of a release by it), then the marker."""
    store, keyring = tmp_path / "store", tmp_path / "ring"
    store.mkdir()
    publisher = make_ec_key(tmp_path / "keys", "publisher")
    publisher.public_pem(keyring / "publisher.pem")
    build = write_scale_release(tmp_path / "build", "any", "thing", k=7.0, checksums=False)
    (build / "tokenizer.json").write_text("{}", encoding="utf-8")  # after model.sig by name
    publisher.sign(build)
    daemon = daemons(store, config=f"store:\n  require_signature: true\n  keyring: {keyring}\n")

    checked = controlplane(
        "release", "check", str(build), "--keyring", str(keyring), "--require-signature",
        "-o", "json",
    )  # fmt: skip
    published = controlplane("release", "publish", str(build), f"{store}/{model_name}/r1")

    assert checked.returncode == 0, checked.stderr
    assert document(checked)["steps"][0]["detail"]["signer"] == "publisher"
    assert published.returncode == 0, published.stderr
    order = [line.split()[1] for line in published.stdout.splitlines() if "uploaded  " in line]
    assert order == ["1/model.py", "config.pbtxt", "tokenizer.json", "model.sig", "SHA256SUMS"]
    sums = (store / model_name / "r1" / "SHA256SUMS").read_text(encoding="utf-8")
    assert sorted(line.split()[1] for line in sums.splitlines()) == [
        "1/model.py",
        "config.pbtxt",
        "tokenizer.json",
    ]
    deployed = daemon.deploy(model_name, "r1")
    assert deployed.status_code == 200, deployed.text
    signature = next(s for s in deployed.json()["operation"]["steps"] if s["name"] == "signature")
    assert signature["detail"]["signer"] == "publisher"
    assert signature["detail"]["signed_with"] == ["model.sig"]
    assert serves(triton, model_name, 7.0)


@pytest.mark.parametrize("curve", ["p256", "p384"])
def test_publish_signs_model_sig_as_model_signing_does_and_a_member_verifies_it(
    daemons: DaemonFactory, tmp_path: Path, model_name: str, triton: RunningTriton, curve: str
) -> None:
    """``--sign KEY --sign-as model.sig``: Model Signing's own verifier accepts what we wrote,
    a member that requires signatures deploys it with the key's name as signer, and a key that
    Model Signing's key mode does not take is refused before anything is uploaded."""
    store, keyring = tmp_path / "store", tmp_path / "ring"
    store.mkdir()
    key = make_ec_key(tmp_path / "keys", "ci-model-key", curve)
    key.public_pem(keyring / "ci-model-key.pem")
    daemon = daemons(store, config=f"store:\n  require_signature: true\n  keyring: {keyring}\n")
    build = write_scale_release(tmp_path / "build", "any", "thing", k=8.0, checksums=False)
    published_dir = store / model_name / "r1"
    openssl_key = make_key(tmp_path / "keys", "ed", "ed25519").private

    wrong = controlplane(
        "release", "publish", str(build), f"{store}/{model_name}/r0",
        "--sign", str(openssl_key), "--sign-as", "model.sig",
    )  # fmt: skip
    published = controlplane(
        "release", "publish", str(build), str(published_dir),
        "--sign", str(key.private), "--sign-as", "model.sig",
    )  # fmt: skip

    assert wrong.returncode == 2
    assert "is not an ECDSA P-256 or P-384 private key" in wrong.stderr
    assert not (store / model_name / "r0").exists()
    assert published.returncode == 0, published.stderr
    model_signing(
        "verify", "key", published_dir, "--public_key", keyring / "ci-model-key.pem",
        "--signature", published_dir / "model.sig",
        "--ignore-paths", published_dir / "SHA256SUMS",
    )  # fmt: skip
    deployed = daemon.deploy(model_name, "r1")
    assert deployed.status_code == 200, deployed.text
    signature = next(s for s in deployed.json()["operation"]["steps"] if s["name"] == "signature")
    assert signature["detail"] == {
        "signed": True,
        "signer": "ci-model-key",
        "signed_with": ["model.sig"],
    }
    assert serves(triton, model_name, 8.0)


def _s3_daemon(daemons: DaemonFactory, tmp_path: Path, endpoint: str, bucket: str) -> Daemon:
    return daemons(tmp_path, store_uri=f"s3://{bucket}/{PREFIX}", extra_env=aws_env(endpoint))


def test_a_release_published_to_s3_in_parts_deploys_and_serves(
    daemons: DaemonFactory,
    tmp_path: Path,
    model_name: str,
    triton: RunningTriton,
    s3_bucket: tuple[Any, str],  # noqa: F811
    fault_proxy: FaultProxy,  # noqa: F811
) -> None:
    _client, bucket = s3_bucket
    daemon = _s3_daemon(daemons, tmp_path, fault_proxy.endpoint, bucket)
    build = write_scale_release(tmp_path / "build", "any", "thing", k=4.0, checksums=False)
    (build / "1" / "weights.bin").write_bytes(os.urandom(11 * MIB))
    where = f"s3://{bucket}/{PREFIX}/{model_name}/r1"

    published = controlplane(
        "release", "publish", str(build), where, "--multipart-threshold", str(5 * MIB),
        "--part-size", str(5 * MIB), "-o", "json", env=aws_env(fault_proxy.endpoint),
    )  # fmt: skip

    assert published.returncode == 0, published.stderr
    assert sorted(document(published)["uploaded"]) == [
        "1/model.py",
        "1/weights.bin",
        "config.pbtxt",
    ]
    weights = f"/{bucket}/{PREFIX}/{model_name}/r1/1/weights.bin"
    parts = [r for r in fault_proxy.requests if r.path == weights and r.method == "PUT"]
    assert len(parts) == 3  # 11 MiB in parts of 5 MiB: a multipart upload
    ours = f"/{bucket}/{PREFIX}/{model_name}/r1/"  # not the daemon's heartbeats
    keys = [r.path for r in fault_proxy.requests if r.method == "PUT" and ours in r.path]
    assert keys[-1].endswith(f"/{model_name}/r1/SHA256SUMS")  # the marker last
    assert daemon.deploy(model_name, "r1").status_code == 200
    assert serves(triton, model_name, 4.0)


def test_an_upload_cut_in_the_middle_leaves_no_marker_and_a_rerun_completes_it(
    daemons: DaemonFactory,
    tmp_path: Path,
    model_name: str,
    triton: RunningTriton,
    s3_bucket: tuple[Any, str],  # noqa: F811
    fault_proxy: FaultProxy,  # noqa: F811
) -> None:
    client, bucket = s3_bucket
    daemon = _s3_daemon(daemons, tmp_path, fault_proxy.endpoint, bucket)
    build = write_scale_release(tmp_path / "build", "any", "thing", k=5.0, checksums=False)
    where = f"s3://{bucket}/{PREFIX}/{model_name}/r1"
    env = aws_env(fault_proxy.endpoint)
    # Files go up in the order of their paths (1/model.py, then config.pbtxt): the cut is
    # between the two, one is there, the other is not.
    fault_proxy.fail_always("drop", "/config.pbtxt", method="PUT")

    cut = controlplane("release", "publish", str(build), where, "--retry-seconds", "1", env=env)

    assert cut.returncode == EXIT_FAILED
    assert "error: store_unavailable:" in cut.stderr
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"{PREFIX}/{model_name}/r1/")
    names = sorted(o["Key"].rsplit("/r1/", 1)[1] for o in listed.get("Contents", []))
    assert names == ["1/model.py"]  # a file whole, no marker
    refused = daemon.deploy(model_name, "r1")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "release_incomplete"

    fault_proxy.clear()
    rerun = controlplane("release", "publish", str(build), where, "-o", "json", env=env)

    assert rerun.returncode == 0, rerun.stderr
    assert document(rerun)["kept"] == ["1/model.py"]
    assert document(rerun)["uploaded"] == ["config.pbtxt"]
    assert daemon.deploy(model_name, "r1").status_code == 200
    assert serves(triton, model_name, 5.0)
    again = controlplane("release", "publish", str(build), where, "-o", "json", env=env)
    assert again.returncode == EXIT_FAILED
    assert document(again)["error"]["code"] == "release_exists"
