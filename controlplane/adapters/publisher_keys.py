"""Publisher keys in PEM, and signatures checked with them: the one place that calls
``cryptography``.

Imported by :class:`controlplane.adapters.keyring.Keyring` when it is built, so a daemon with no
``store.keyring`` never loads ``cryptography`` (and the OpenSSL it carries).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa, x448, x25519
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from controlplane.adapters.keyring import KeyringError
from controlplane.domain.model_signing import pae

PublicKey = ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey


@dataclass(frozen=True)
class ParsedKey:
    key: PublicKey
    not_before: datetime | None
    not_after: datetime | None


class PemKeys:
    """Reads Ed25519 and ECDSA P-256 / P-384 keys and checks signatures made with them
    (``SHA256SUMS.sig``: ECDSA over SHA-256, as ``openssl dgst -sha256`` signs)."""

    def parse(self, path: Path, data: bytes) -> ParsedKey:
        """The key in ``data`` (a PEM public key or certificate, read from ``path``), or
        :class:`KeyringError` naming the file and what is wrong with it."""
        not_before = not_after = None
        key: object
        try:
            if b"-----BEGIN CERTIFICATE-----" in data:
                certificate = x509.load_pem_x509_certificate(data)
                key = certificate.public_key()
                not_before = certificate.not_valid_before_utc
                not_after = certificate.not_valid_after_utc
            else:
                key = serialization.load_pem_public_key(data)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise KeyringError(
                f"{path} is neither a PEM public key nor a PEM certificate ({exc})"
            ) from None
        if isinstance(key, ec.EllipticCurvePublicKey) and not isinstance(
            key.curve, ec.SECP256R1 | ec.SECP384R1
        ):
            raise KeyringError(
                f"{path} holds an ECDSA key on curve {key.curve.name}; the keyring takes Ed25519 "
                "and ECDSA P-256 (prime256v1) or P-384 (secp384r1) keys only"
            )
        if not isinstance(key, ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey):
            raise KeyringError(
                f"{path} holds {_kind(key)} key; the keyring takes Ed25519 and ECDSA P-256 or "
                "P-384 keys only"
            )
        return ParsedKey(key, not_before, not_after)

    def verifies(self, key: PublicKey, data: bytes, signature: bytes) -> bool:
        try:
            if isinstance(key, ed25519.Ed25519PublicKey):
                key.verify(signature, data)
            else:
                key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, ValueError):
            return False
        return True

    def malformed(self, signature: bytes) -> bool:
        """Neither a raw Ed25519 signature nor a DER ECDSA one."""
        if len(signature) == 64:
            return False
        try:
            decode_dss_signature(signature)
        except ValueError:
            return True
        return False


def _kind(key: object) -> str:
    for kind, name in (
        (rsa.RSAPublicKey, "an RSA"),
        (dsa.DSAPublicKey, "a DSA"),
        (ed448.Ed448PublicKey, "an Ed448"),
        (x25519.X25519PublicKey, "an X25519"),
        (x448.X448PublicKey, "an X448"),
    ):
        if isinstance(key, kind):
            return name
    return f"a {type(key).__name__}"


def _private_key(path: Path) -> object:
    """The private key in the PEM file ``path``, or :class:`KeyringError` saying why not."""
    try:
        return serialization.load_pem_private_key(path.read_bytes(), password=None)
    except OSError as exc:
        raise KeyringError(f"cannot read the signing key {path}: {exc.strerror or exc}") from None
    except TypeError:
        raise KeyringError(
            f"{path} is an encrypted private key; give an unencrypted PEM (from a CI secret), "
            "as openssl genpkey writes it"
        ) from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise KeyringError(f"{path} is not a PEM private key ({exc})") from None


def sign_with(path: Path, data: bytes) -> bytes:
    """``data`` signed with the private key in the PEM file ``path``, as the openssl commands
    of docs/signatures.md sign it: Ed25519 raw (``pkeyutl -sign -rawin``), ECDSA P-256 over
    SHA-256 in DER (``dgst -sha256 -sign``). Any other key, or a file that holds none, is
    :class:`KeyringError` naming the file."""
    key = _private_key(path)
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key.sign(data)
    if isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1):
        return key.sign(data, ec.ECDSA(hashes.SHA256()))
    raise KeyringError(
        f"{path} is not an Ed25519 or ECDSA P-256 private key; a member's keyring takes only "
        "those (openssl genpkey -algorithm ed25519)"
    )


_CURVE_HASHES: dict[int, type[hashes.HashAlgorithm]] = {256: hashes.SHA256, 384: hashes.SHA384}


def sign_model(path: Path, payload: bytes) -> tuple[bytes, str]:
    """``payload`` (an in-toto statement) signed with the EC private key in the PEM file
    ``path`` as ``model_signing sign key`` signs it: ECDSA over DSSE's encoding, with the
    curve's hash; and the key's hint (the SHA-256 of its public PEM). Any key but EC P-256 or
    P-384 is :class:`KeyringError` naming the file."""
    key = _private_key(path)
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.key_size not in _CURVE_HASHES:
        raise KeyringError(
            f"{path} is not an ECDSA P-256 or P-384 private key; Model Signing's key mode "
            "takes only those (openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256)"
        )
    signature = key.sign(pae(payload), ec.ECDSA(_CURVE_HASHES[key.curve.key_size]()))
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return signature, hashlib.sha256(public).hexdigest()
