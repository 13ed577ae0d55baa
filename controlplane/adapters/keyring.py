"""The keyring of publisher keys, and the one place that calls ``cryptography``.

``store.keyring`` names a dir of ``*.pem`` files or a list of PEM files; each key is named by
its file's stem. A PEM holds a public key (``openssl pkey -pubout``) or an X.509 certificate,
whose notBefore and notAfter bound when its key is trusted (that is how a key expires; the
certificate's own signature is not checked: the keyring is what the operator trusts). Keys in
the dir's ``retired/`` are known but no longer trusted, so a release they signed is named as
such (``unknown_signer``) rather than as a bad signature. Only Ed25519 and ECDSA P-256 keys
are accepted: a keyring with anything else is refused at start-up, naming the file.

The keyring is read again at every verification (it is a few small files), so a key added or
retired while the daemon runs counts at the next deploy, with no restart; a keyring that cannot
be read then refuses the signature, naming the path, and never trusts anything by default.

The signatures are what plain openssl writes over the bytes of ``SHA256SUMS``: Ed25519 from
``openssl pkeyutl -sign -rawin`` (64 raw bytes), ECDSA P-256 with SHA-256 from
``openssl dgst -sha256 -sign`` (DER).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa, x448, x25519
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from controlplane.domain.signatures import (
    RETIRED_DIR,
    KeyTrust,
    Trust,
    judge,
    keyring_unreadable,
    trust_of,
)

MAX_PEM_BYTES = 64 * 1024  # a public key or a certificate is a few hundred bytes
_PublicKey = ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey


class KeyringError(ValueError):
    """The keyring cannot be used: the message names the file and what is wrong with it."""


@dataclass(frozen=True)
class _Key:
    name: str
    path: Path
    key: _PublicKey
    retired: bool
    not_before: datetime | None
    not_after: datetime | None

    def trust(self, now: datetime) -> KeyTrust:
        return trust_of(
            self.name,
            now=now,
            retired=self.retired,
            not_before=self.not_before,
            not_after=self.not_after,
        )

    def verifies(self, data: bytes, signature: bytes) -> bool:
        try:
            if isinstance(self.key, ed25519.Ed25519PublicKey):
                self.key.verify(signature, data)
            else:
                self.key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, ValueError):
            return False
        return True


class Keyring:
    """Publisher keys from ``paths`` (dirs of ``*.pem`` and PEM files), read at every use."""

    def __init__(self, paths: Sequence[Path], *, now: Callable[[], datetime]) -> None:
        if not paths:
            raise KeyringError("store.keyring names no dir or file")
        self._paths = tuple(paths)
        self._now = now

    @property
    def where(self) -> str:
        return ", ".join(str(path) for path in self._paths)

    def check(self) -> list[str]:
        """Read every key now (start-up): the names of the trusted ones, or
        :class:`KeyringError` naming the file that cannot be used."""
        now = self._now()
        keys = self._load()
        return [key.name for key in keys if key.trust(now).trust is Trust.TRUSTED]

    def verify(self, data: bytes, signature: bytes, where: str) -> str:
        """The name of the trusted key whose signature over ``data`` is ``signature``, or the
        refusal (:class:`SignatureInvalid`, :class:`UnknownSigner`) that says why not."""
        try:
            keys = self._load()
        except KeyringError as exc:
            raise keyring_unreadable(self.where, str(exc)) from None
        now = self._now()
        verified = [key.name for key in keys if key.verifies(data, signature)]
        return judge(
            where,
            [key.trust(now) for key in keys],
            verified,
            malformed=not verified and _malformed(signature),
        )

    def _load(self) -> list[_Key]:
        files: list[tuple[Path, bool]] = []
        for path in self._paths:
            if path.is_dir():
                files += [(pem, False) for pem in _pems(path)]
                if (path / RETIRED_DIR).is_dir():
                    files += [(pem, True) for pem in _pems(path / RETIRED_DIR)]
            elif path.exists():
                files.append((path, False))
            else:
                raise KeyringError(f"{path} does not exist")
        keys: dict[str, _Key] = {}
        for file, is_retired in files:
            key = _read(file, is_retired)
            if key.name in keys:
                raise KeyringError(
                    f"two keys are named {key.name!r}: {keys[key.name].path} and {file}; a key "
                    "is named by its file's stem, so rename one"
                )
            keys[key.name] = key
        if not keys:
            raise KeyringError(f"no *.pem file in {self.where}")
        return list(keys.values())


def _pems(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.suffix == ".pem" and p.is_file())
    except OSError as exc:
        raise KeyringError(f"{folder}: {exc.strerror or exc}") from None


def _read(path: Path, retired: bool) -> _Key:
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_PEM_BYTES + 1)
    except OSError as exc:
        raise KeyringError(f"{path}: {exc.strerror or exc}") from None
    if len(data) > MAX_PEM_BYTES:
        raise KeyringError(f"{path} is larger than {MAX_PEM_BYTES} bytes: no public key is")
    if b"PRIVATE KEY-----" in data:
        raise KeyringError(
            f"{path} holds a private key: the keyring takes public keys only (write the "
            "public part with `openssl pkey -in key.pem -pubout`); the private key belongs to "
            "the publisher alone"
        )
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
    if isinstance(key, ec.EllipticCurvePublicKey) and not isinstance(key.curve, ec.SECP256R1):
        raise KeyringError(
            f"{path} holds an ECDSA key on curve {key.curve.name}; the keyring takes Ed25519 and "
            "ECDSA P-256 (prime256v1) keys only"
        )
    if not isinstance(key, ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey):
        raise KeyringError(
            f"{path} holds {_kind(key)} key; the keyring takes Ed25519 and ECDSA P-256 keys only"
        )
    return _Key(os.path.splitext(path.name)[0], path, key, retired, not_before, not_after)


def _malformed(signature: bytes) -> bool:
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
