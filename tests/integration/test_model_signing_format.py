"""The daemon's reading of ``model.sig`` checked against OpenSSF Model Signing's own: each
signature here is made by the ``model_signing`` CLI, then judged by its ``verify`` command and by
the keyring; both must accept the same ones and refuse the same ones, and the files the keyring
reads from an accepted one are the files' real digests.

No Triton: the keyring alone (the daemon's path through it is tests/integration/
test_model_signing.py). In the integration tier because each CLI run takes a second or two.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from controlplane.adapters.keyring import Keyring, KeyringError
from controlplane.domain.errors import SignatureInvalid, UnknownSigner
from tests.support.model_signing import MODEL_SIGNING, make_ca, make_ec_key


def now() -> datetime:
    return datetime.now(UTC)


def model_dir(root: Path) -> Path:
    release = root / "resnet" / "r1"
    (release / "1").mkdir(parents=True)
    (release / "1" / "model.py").write_text("print('model')\n", encoding="utf-8")
    (release / "config.pbtxt").write_text('name: "resnet"\n', encoding="utf-8")
    return release


def library_accepts(release: Path, *how: str | Path) -> bool:
    """``model_signing verify ...`` over ``release`` and its ``model.sig``."""
    signature = ["--signature", str(release / "model.sig")]
    done = subprocess.run(
        [str(MODEL_SIGNING), "verify", *map(str, how), str(release), *signature],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode == 0


def digests(release: Path) -> dict[str, str]:
    return {
        p.relative_to(release).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in release.rglob("*")
        if p.is_file() and p.name != "model.sig"
    }


@pytest.mark.parametrize("curve", ["p256", "p384"])
def test_key_mode_agrees_with_the_library(tmp_path: Path, curve: str) -> None:
    release, ring = model_dir(tmp_path), tmp_path / "ring"
    publisher = make_ec_key(tmp_path / "keys", "publisher", curve)
    stranger = make_ec_key(tmp_path / "keys", "stranger", curve)
    pem = publisher.public_pem(ring / "publisher.pem")
    keyring = Keyring([ring], now=now)

    publisher.sign(release)
    assert library_accepts(release, "key", "--public_key", pem)
    signed = keyring.verify_model_signature("resnet", "r1", (release / "model.sig").read_bytes())
    assert (signed.signer, dict(signed.files)) == ("publisher", digests(release))

    stranger.sign(release)
    assert not library_accepts(release, "key", "--public_key", pem)
    with pytest.raises(SignatureInvalid, match="does not verify with any EC key"):
        keyring.verify_model_signature("resnet", "r1", (release / "model.sig").read_bytes())

    # The key retired: known, no longer trusted.
    publisher.sign(release)
    (ring / "retired").mkdir()
    pem.rename(ring / "retired" / "publisher.pem")
    with pytest.raises(UnknownSigner, match="key 'publisher' is retired"):
        keyring.verify_model_signature("resnet", "r1", (release / "model.sig").read_bytes())


def test_certificate_mode_agrees_with_the_library(tmp_path: Path) -> None:
    release, ring = model_dir(tmp_path), tmp_path / "ring"
    ca, other = make_ca(tmp_path / "pki", "Test CA"), make_ca(tmp_path / "pki", "Other CA")
    ca_pem = ca.pem(ring / "ca" / "test-ca.pem")
    keyring = Keyring([ring], now=now)
    assert keyring.check() == ["ca/test-ca"]  # a keyring of CAs alone is one

    ci = ca.issue("ci-publisher")
    ci.sign(release)
    assert library_accepts(release, "certificate", "--certificate_chain", ca_pem)
    signed = keyring.verify_model_signature("resnet", "r1", (release / "model.sig").read_bytes())
    assert (signed.signer, dict(signed.files)) == (ci.subject, digests(release))

    other.issue("intruder").sign(release)
    assert not library_accepts(release, "certificate", "--certificate_chain", ca_pem)
    with pytest.raises(SignatureInvalid, match=r"leads to no CA of the keyring's ca/"):
        keyring.verify_model_signature("resnet", "r1", (release / "model.sig").read_bytes())


def test_a_statement_edited_after_signing_is_refused_by_both(tmp_path: Path) -> None:
    """A digest in the signed statement changed (to match a swapped file): the signature no
    longer verifies, for the library as for the keyring."""
    release, ring = model_dir(tmp_path), tmp_path / "ring"
    publisher = make_ec_key(tmp_path / "keys", "publisher")
    pem = publisher.public_pem(ring / "publisher.pem")
    publisher.sign(release)
    (release / "1" / "model.py").write_text("print('swapped')\n", encoding="utf-8")
    bundle = json.loads((release / "model.sig").read_bytes())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    for resource in statement["predicate"]["resources"]:
        if resource["name"] == "1/model.py":
            resource["digest"] = digests(release)["1/model.py"]
    root = b"".join(bytes.fromhex(r["digest"]) for r in statement["predicate"]["resources"])
    statement["subject"][0]["digest"]["sha256"] = hashlib.sha256(root).hexdigest()
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    (release / "model.sig").write_text(json.dumps(bundle), encoding="utf-8")

    assert not library_accepts(release, "key", "--public_key", pem)
    with pytest.raises(SignatureInvalid, match="does not verify with any EC key"):
        Keyring([ring], now=now).verify_model_signature(
            "resnet", "r1", (release / "model.sig").read_bytes()
        )


def test_a_ca_dir_that_holds_no_ca_is_refused_at_start_up(tmp_path: Path) -> None:
    ring = tmp_path / "ring"
    ca = make_ca(tmp_path / "pki", "Test CA")
    leaf = ca.issue("ci-publisher")
    (ring / "ca").mkdir(parents=True)
    (ring / "ca" / "leaf.pem").write_bytes(leaf.certificate.read_bytes())
    with pytest.raises(KeyringError, match=r"leaf\.pem holds a certificate that is no CA"):
        Keyring([ring], now=now).check()
