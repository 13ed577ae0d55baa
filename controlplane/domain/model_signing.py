"""OpenSSF Model Signing's ``model.sig``: what it holds, what it signs, and the manifest it
carries.

``model.sig`` (written by ``model_signing sign key|certificate``, as NGC, Kaggle and others
publish it) is a Sigstore bundle in JSON: a DSSE envelope whose payload is an in-toto
statement, signed with an EC key over the envelope's pre-authentication encoding (:func:`pae`).
The statement's predicate lists each file of the model with its SHA-256 (``resources``), and its
one subject carries a digest over those digests. The bundle's ``verificationMaterial`` says how
to check the signature: a ``publicKey`` hint (key mode: a key the verifier already holds) or an
``x509CertificateChain`` (certificate mode: the signing certificate, then the certificates that
lead to a CA the verifier trusts).

A release that carries ``model.sig`` needs no ``SHA256SUMS``: once the signature verifies, its
``resources`` are the release's manifest, checked before anything else of the release is
fetched, as ``SHA256SUMS.sig`` is. Unlike that statement, ``model.sig`` names no model or
release of the store (its subject is the name of the dir it was signed in), so a signed release
copied under another name verifies there too; docs/signatures.md says so.

Pure: parsing and judging here; the cryptography in :mod:`controlplane.adapters.model_signature`.
Every refusal is one of the signature codes (``signature_invalid``, ``unknown_signer``) and its
message names ``model.sig`` and what to do.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controlplane.domain.checksums import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    SIGNATURE_NAME,
    safe_relpath,
)
from controlplane.domain.errors import ControlPlaneError, SignatureInvalid, UnknownSigner
from controlplane.domain.signatures import KeyTrust, Trust

MODEL_SIGNATURE_NAME = "model.sig"
# About 200 bytes a file once base64'd: a million files' worth, as for SHA256SUMS.
MAX_MODEL_SIGNATURE_BYTES = 2 * MAX_MANIFEST_BYTES
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
OLD_PREDICATE_TYPE = "https://model_signing/Digests/v0.1"  # model_signing before 1.0
# Files of the release that a model.sig may list (signed after they were written) but that
# are never fetched with the release: their listed digest is checked against what was read.
MARKER_FILES = frozenset({MANIFEST_NAME, SIGNATURE_NAME})
_HEX64 = re.compile(r"[0-9a-f]{64}")
HOW_TO_SIGN = (
    "sign the release dir with `model_signing sign key DIR --private_key key.pem "
    f"--signature DIR/{MODEL_SIGNATURE_NAME}` (or `sign certificate`) as docs/signatures.md shows"
)


@dataclass(frozen=True)
class ModelBundle:
    """A ``model.sig`` as parsed, nothing verified yet."""

    payload: bytes  # the in-toto statement's JSON, as signed
    signature: bytes  # DER ECDSA over pae(payload)
    key_hint: str | None  # key mode: SHA-256 of the signer's public key PEM
    certificates: tuple[bytes, ...]  # certificate mode: DER, signing certificate first

    @property
    def signed_data(self) -> bytes:
        return pae(self.payload)


@dataclass(frozen=True)
class SignedManifest:
    """What a verified ``model.sig`` says: who signed it, and the release's files
    (path -> SHA-256), the marker files it may list left out (:data:`MARKER_FILES`)."""

    signer: str
    files: Mapping[str, str]
    markers: Mapping[str, str]  # SHA256SUMS / SHA256SUMS.sig as listed, when they are


def pae(payload: bytes, payload_type: str = PAYLOAD_TYPE) -> bytes:
    """DSSE's pre-authentication encoding: what the envelope's signature is over."""
    head = f"DSSEv1 {len(payload_type)} {payload_type} {len(payload)} "
    return head.encode() + payload


def where_named(model: str, release: str) -> str:
    return f"{MODEL_SIGNATURE_NAME} of release {release!r} of {model!r}"


def invalid(where: str, why: str, **details: object) -> SignatureInvalid:
    return SignatureInvalid(f"{where} {why}; {HOW_TO_SIGN}, and publish it again", details=details)


def parse_bundle(data: bytes, where: str) -> ModelBundle:
    """The parts of a ``model.sig`` that verification needs, or ``signature_invalid`` saying
    what is not as ``model_signing`` writes it."""
    if len(data) > MAX_MODEL_SIGNATURE_BYTES:
        raise invalid(where, f"is larger than {MAX_MODEL_SIGNATURE_BYTES} bytes")
    try:
        bundle = json.loads(data)
        envelope = bundle["dsseEnvelope"]
        material = bundle["verificationMaterial"]
        payload_type = envelope["payloadType"]
        payload = _b64(envelope["payload"])
        signatures = envelope["signatures"]
    except (ValueError, KeyError, TypeError) as exc:
        raise invalid(where, f"is not a Sigstore bundle with a DSSE envelope ({exc!r})") from None
    if not isinstance(material, dict) or not isinstance(signatures, list):
        raise invalid(where, "is not a Sigstore bundle with a DSSE envelope")
    if payload_type != PAYLOAD_TYPE:
        raise invalid(where, f"carries a {payload_type!r} payload, not an in-toto statement")
    if len(signatures) != 1:
        raise invalid(where, f"carries {len(signatures)} signatures; model_signing writes one")
    try:
        signature = _b64(signatures[0]["sig"])
        certificates = tuple(
            _b64(entry["rawBytes"])
            for entry in (material.get("x509CertificateChain") or {}).get("certificates", [])
        )
        if not certificates and "certificate" in material:  # a bundle of v0.3 with one cert
            certificates = (_b64(material["certificate"]["rawBytes"]),)
        hint = (material.get("publicKey") or {}).get("hint")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise invalid(where, f"has a malformed signature or certificate ({exc!r})") from None
    if not certificates and "publicKey" not in material:
        raise invalid(
            where,
            "has neither a public key hint nor a certificate chain (a Sigstore-keyless bundle "
            "needs the public transparency log, which the daemon does not reach: sign with a "
            "key or a certificate)",
        )
    return ModelBundle(payload, signature, hint if isinstance(hint, str) else None, certificates)


def read_manifest(bundle: ModelBundle, where: str, signer: str) -> SignedManifest:
    """The files the statement lists (each path checked as ``SHA256SUMS``'s are), once its
    signature has verified; ``signature_invalid`` when it is not what ``model_signing``
    1.x signs: one subject whose digest is over the listed digests, a ``files``
    serialization, SHA-256 only."""
    try:
        statement = json.loads(bundle.payload)
        kind, predicate_type = statement["_type"], statement["predicateType"]
        subjects, predicate = statement["subject"], statement["predicate"]
        serialization, resources = predicate["serialization"], predicate["resources"]
    except (ValueError, KeyError, TypeError) as exc:
        raise invalid(where, f"signs no in-toto statement of model_signing ({exc!r})") from None
    if kind != STATEMENT_TYPE:
        raise invalid(where, f"signs a statement of type {kind!r}, not {STATEMENT_TYPE!r}")
    if predicate_type == OLD_PREDICATE_TYPE:
        raise invalid(
            where,
            "was written by model_signing before 1.0 (predicate Digests/v0.1), whose "
            "statement lists no serialization: sign it again with model_signing 1.x",
        )
    if predicate_type != PREDICATE_TYPE:
        raise invalid(where, f"signs a predicate of type {predicate_type!r}")
    method = serialization.get("method") if isinstance(serialization, dict) else None
    if method != "files":
        raise invalid(
            where,
            f"lists the model serialized as {method!r}; the daemon takes per-file digests "
            "(method 'files', model_signing's default: sign without --use_shards)",
        )
    files = _resources(resources, where)
    if not isinstance(subjects, list) or len(subjects) != 1:
        raise invalid(where, "has not exactly one subject")
    root = hashlib.sha256(b"".join(bytes.fromhex(d) for d in files.values())).hexdigest()
    try:
        said = subjects[0]["digest"]["sha256"]
    except (KeyError, TypeError):
        said = None
    if said != root:
        raise invalid(where, "is inconsistent: its subject's digest is not over its resources")
    markers = {rel: files.pop(rel) for rel in MARKER_FILES if rel in files}
    if not files:
        raise invalid(where, "lists no file of the model")
    return SignedManifest(signer, files, markers)


def _resources(resources: object, where: str) -> dict[str, str]:
    if not isinstance(resources, list):
        raise invalid(where, "has no list of resources")
    files: dict[str, str] = {}
    for resource in resources:
        try:
            name, algorithm, digest = resource["name"], resource["algorithm"], resource["digest"]
        except (KeyError, TypeError):
            raise invalid(where, "has a resource that is not {name, algorithm, digest}") from None
        if algorithm != "sha256":
            raise invalid(
                where,
                f"lists {name!r} with a {algorithm!r} digest; the daemon checks SHA-256 (sign "
                "with model_signing's default hash)",
            )
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise invalid(where, f"lists {name!r} with a digest that is no SHA-256")
        try:
            rel = str(safe_relpath(name)) if isinstance(name, str) else None
        except ControlPlaneError as exc:
            raise invalid(where, f"lists an unsafe path: {exc.args[0]}") from None
        if rel is None or rel == MODEL_SIGNATURE_NAME or rel in files:
            raise invalid(where, f"lists {name!r} as a file of the model")
        files[rel] = digest
    return files


def judge_key(where: str, keys: Sequence[KeyTrust], verified_by: Sequence[str]) -> str:
    """Key mode: the trusted key (by name) that verifies ``where``, or why there is none."""
    verified = [key for key in keys if key.name in verified_by]
    for key in verified:
        if key.trust is Trust.TRUSTED:
            return key.name
    if verified:
        reasons = "; ".join(key.why() for key in verified)
        raise UnknownSigner(
            f"{where} was signed by a key the keyring does not trust now: {reasons}. Sign the "
            "release again with a trusted key (or put the key back in the keyring)",
            details={"keys": [key.name for key in verified]},
        )
    names = ", ".join(k.name for k in keys if k.trust is Trust.TRUSTED) or "none"
    raise SignatureInvalid(
        f"{where} does not verify with any EC key of the keyring (trusted keys: {names}): its "
        "statement changed after it was signed, or a key the keyring does not hold signed it. "
        f"Add the publisher's public key to the keyring, or {HOW_TO_SIGN} with a key it holds "
        "and publish it again",
        details={"keys": [key.name for key in keys]},
    )


def disagreement(where: str, sums: Mapping[str, str], signed: Mapping[str, str]) -> None:
    """Refuse a release whose ``SHA256SUMS`` (``sums``) and ``model.sig`` (the files it lists,
    ``signed``) do not describe the same files: a release with both is checked against both."""
    differ = sorted(rel for rel in set(sums) | set(signed) if sums.get(rel) != signed.get(rel))
    if differ:
        raise SignatureInvalid(
            f"{MANIFEST_NAME} and {where} do not list the same files and digests "
            f"({', '.join(differ[:5])}): the release was changed after one of them was made; "
            f"write {MANIFEST_NAME} and sign both from the same files, then publish them again",
            details={"files": differ},
        )


# What model_signing 1.x leaves out of a dir it signs (``model.sig`` itself and git's files):
# written into a statement made here as it writes it, so its own verifier reads ours alike.
IGNORED_WHEN_SIGNING = ("model.sig", ".gitattributes", ".gitignore", ".github", ".git")


def statement(subject: str, files: Mapping[str, str]) -> bytes:
    """The in-toto statement ``model_signing sign`` makes for a dir named ``subject`` holding
    ``files`` (path -> SHA-256): the payload a publisher signs (``release publish --sign KEY
    --sign-as model.sig``). Resources sorted by path; the subject's digest is over their
    digests in that order, as :func:`read_manifest` checks."""
    names = sorted(files)
    root = hashlib.sha256(b"".join(bytes.fromhex(files[n]) for n in names)).hexdigest()
    document = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": subject, "digest": {"sha256": root}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "serialization": {
                "allow_symlinks": False,
                "hash_type": "sha256",
                "ignore_paths": list(IGNORED_WHEN_SIGNING),
                "method": "files",
            },
            "resources": [{"name": n, "digest": files[n], "algorithm": "sha256"} for n in names],
        },
    }
    return json.dumps(document, separators=(",", ":")).encode("utf-8")


def key_bundle(payload: bytes, signature: bytes, key_hint: str) -> bytes:
    """A key-mode ``model.sig``: the Sigstore bundle around ``payload`` and its DSSE
    ``signature``, ``key_hint`` the SHA-256 of the public key's PEM (as model_signing writes)."""
    bundle = {
        "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
        "verificationMaterial": {"publicKey": {"hint": key_hint}, "tlogEntries": []},
        "dsseEnvelope": {
            "payload": base64.b64encode(payload).decode("ascii"),
            "payloadType": PAYLOAD_TYPE,
            "signatures": [{"sig": base64.b64encode(signature).decode("ascii"), "keyid": ""}],
        },
    }
    return json.dumps(bundle, indent=2).encode("utf-8")


def _b64(value: object) -> bytes:
    if not isinstance(value, str):
        raise ValueError("not base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"not base64: {exc}") from None
