"""``model.sig`` as the domain reads it: the bundle's parts, the signed statement's files, and
every way it can be other than what ``model_signing`` 1.x writes (each a ``signature_invalid``
that says what). The signatures themselves are checked against the library's CLI in
tests/integration/test_model_signing_format.py."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest

from controlplane.domain.errors import SignatureInvalid
from controlplane.domain.model_signing import (
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    disagreement,
    pae,
    parse_bundle,
    read_manifest,
)

WHERE = "model.sig of release 'r1' of 'resnet'"
A, B = hashlib.sha256(b"a").hexdigest(), hashlib.sha256(b"b").hexdigest()


def statement(resources: list[dict[str, Any]], **changes: Any) -> dict[str, Any]:
    root = hashlib.sha256(b"".join(bytes.fromhex(r["digest"]) for r in resources)).hexdigest()
    value: dict[str, Any] = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "r1", "digest": {"sha256": root}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "serialization": {"method": "files", "hash_type": "sha256", "ignore_paths": []},
            "resources": resources,
        },
    }
    value.update(changes)
    return value


def files(*pairs: tuple[str, str]) -> list[dict[str, Any]]:
    return [{"name": name, "algorithm": "sha256", "digest": digest} for name, digest in pairs]


def bundle(payload: dict[str, Any] | bytes, **material: Any) -> bytes:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return json.dumps(
        {
            "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
            "verificationMaterial": material or {"publicKey": {"hint": "ab"}},
            "dsseEnvelope": {
                "payload": base64.b64encode(raw).decode(),
                "payloadType": PAYLOAD_TYPE,
                "signatures": [{"sig": base64.b64encode(b"0" * 70).decode(), "keyid": ""}],
            },
        }
    ).encode()


def test_a_bundle_gives_its_payload_signature_and_the_files_it_lists() -> None:
    listed = statement(files(("config.pbtxt", A), ("1/model.py", B), ("SHA256SUMS", A)))
    parsed = parse_bundle(bundle(listed), WHERE)
    assert (parsed.key_hint, parsed.certificates, parsed.signature) == ("ab", (), b"0" * 70)
    assert parsed.signed_data == pae(parsed.payload)
    assert parsed.signed_data.startswith(b"DSSEv1 28 application/vnd.in-toto+json ")
    manifest = read_manifest(parsed, WHERE, "publisher")
    assert dict(manifest.files) == {"config.pbtxt": A, "1/model.py": B}
    assert dict(manifest.markers) == {"SHA256SUMS": A}  # checked against the bytes read
    chain = {"x509CertificateChain": {"certificates": [{"rawBytes": "AAEC"}]}}
    assert parse_bundle(bundle(listed, **chain), WHERE).certificates == (b"\0\1\2",)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"not json", "is not a Sigstore bundle"),
        (b"{}", "is not a Sigstore bundle"),
        (bundle(b"{}", keylessTlog={"x": 1}), "neither a public key hint nor a certificate"),
        (b"x" * (33 * 1024 * 1024), "is larger than"),
    ],
)
def test_what_is_no_bundle_is_refused_saying_what(data: bytes, said: str) -> None:
    with pytest.raises(SignatureInvalid, match=said) as caught:
        parse_bundle(data, WHERE)
    assert "model_signing sign key" in caught.value.message  # what to do


@pytest.mark.parametrize(
    ("payload", "said"),
    [
        (statement(files(("a", A)), predicateType="https://model_signing/Digests/v0.1"), "1.0"),
        (statement(files(("a", A)), predicateType="https://example/other"), "predicate of type"),
        (statement(files(("a", A)), _type="https://in-toto.io/Statement/v0.1"), "of type"),
        (statement([{"name": "a", "algorithm": "blake2b", "digest": A}]), "'blake2b' digest"),
        (statement(files(("a", "ab" * 31))), "digest that is no SHA-256"),
        (statement(files(("../etc/passwd", A))), "unsafe path"),
        (statement(files(("/abs", A))), "unsafe path"),
        (statement(files(("a", A), ("a", B))), "lists 'a' as a file"),
        (statement(files(("model.sig", A))), "lists 'model.sig' as a file"),
        (statement(files(("SHA256SUMS", A))), "lists no file of the model"),
        (statement(files(("a", A)), subject=[{"name": "r1", "digest": {"sha256": B}}]), "is incon"),
    ],
)
def test_a_statement_not_as_model_signing_writes_it_is_refused(
    payload: dict[str, Any], said: str
) -> None:
    with pytest.raises(SignatureInvalid, match=said):
        read_manifest(parse_bundle(bundle(payload), WHERE), WHERE, "publisher")


def test_a_shard_serialization_is_refused_naming_the_option() -> None:
    payload = statement(files(("a", A)))
    payload["predicate"]["serialization"]["method"] = "shards"
    with pytest.raises(SignatureInvalid, match="sign without --use_shards"):
        read_manifest(parse_bundle(bundle(payload), WHERE), WHERE, "publisher")


def test_sha256sums_and_model_sig_must_list_the_same_files() -> None:
    disagreement(WHERE, {"a": A, "b": B}, {"a": A, "b": B})
    with pytest.raises(SignatureInvalid, match=r"do not list the same files and digests \(b, c\)"):
        disagreement(WHERE, {"a": A, "b": B}, {"a": A, "b": A, "c": A})
