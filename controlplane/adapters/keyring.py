"""The keyring of publisher keys: which keys are trusted, read from ``store.keyring``.

``store.keyring`` names a dir of ``*.pem`` files or a list of PEM files; each key is named by
its file's stem. A PEM holds a public key (``openssl pkey -pubout``) or an X.509 certificate,
whose notBefore and notAfter bound when its key is trusted (that is how a key expires; the
certificate's own signature is not checked: the keyring is what the operator trusts). Keys in
the dir's ``retired/`` are known but no longer trusted, so a release they signed is named as
such (``unknown_signer``) rather than as a bad signature. Only Ed25519 and ECDSA P-256 and
P-384 keys are accepted: a keyring with anything else is refused at start-up, naming the file.
A dir's ``ca/`` holds CA certificates instead: the CAs whose signing certificates a
``model.sig`` in certificate mode may carry (:mod:`.model_signature`).

The keyring is read again at every verification (it is a few small files), so a key added or
retired while the daemon runs counts at the next deploy, with no restart; a keyring that cannot
be read then refuses the signature, naming the path, and never trusts anything by default.

The signatures are what plain openssl writes over a release's statement (its model, its name,
then the bytes of ``SHA256SUMS``: :func:`~controlplane.domain.signatures.statement`): Ed25519
from ``openssl pkeyutl -sign -rawin`` (64 raw bytes), ECDSA P-256 with SHA-256 from
``openssl dgst -sha256 -sign`` (DER). A signature that verifies over ``SHA256SUMS`` alone
instead was made the old way, and is refused as such (``signature_unbound``). A ``model.sig``
(OpenSSF Model Signing, :mod:`controlplane.domain.model_signing`) is checked with the same keys
(key mode: the EC ones) or with the CAs of ``ca/`` (certificate mode).
``cryptography`` reads and checks them (:mod:`.publisher_keys`), imported when a keyring is
built: a daemon without one never loads it (10 MiB of an idle daemon).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from controlplane.domain.model_signing import (
    SignedManifest,
    judge_key,
    parse_bundle,
    read_manifest,
    where_named,
)
from controlplane.domain.signatures import (
    CA_DIR,
    RETIRED_DIR,
    KeyTrust,
    Trust,
    judge,
    keyring_unreadable,
    release_named,
    signing_command,
    statement,
    trust_of,
)

if TYPE_CHECKING:
    from controlplane.adapters.model_signature import Certificate
    from controlplane.adapters.publisher_keys import PublicKey

MAX_PEM_BYTES = 64 * 1024  # a public key or a certificate is a few hundred bytes


class KeyringError(ValueError):
    """The keyring cannot be used: the message names the file and what is wrong with it."""


@dataclass(frozen=True)
class _Key:
    name: str
    path: Path
    key: PublicKey
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


class Keyring:
    """Publisher keys from ``paths`` (dirs of ``*.pem`` and PEM files), read at every use."""

    def __init__(self, paths: Sequence[Path], *, now: Callable[[], datetime]) -> None:
        if not paths:
            raise KeyringError("store.keyring names no dir or file")
        # cryptography: only with a keyring
        from controlplane.adapters import model_signature, publisher_keys

        self._keys = publisher_keys.PemKeys()
        self._model_signatures = model_signature
        self._paths = tuple(paths)
        self._now = now

    @property
    def where(self) -> str:
        return ", ".join(str(path) for path in self._paths)

    def check(self) -> list[str]:
        """Read every key now (start-up): the names of the trusted ones, or
        :class:`KeyringError` naming the file that cannot be used."""
        now = self._now()
        keys, cas = self._load()
        trusted = [key.name for key in keys if key.trust(now).trust is Trust.TRUSTED]
        return trusted + sorted({f"{CA_DIR}/{name}" for name, _ca in cas})

    def verify_release(self, model: str, release: str, manifest: bytes, signature: bytes) -> str:
        """The name of the trusted key whose ``signature`` is over ``release`` of ``model``
        with the ``SHA256SUMS`` bytes ``manifest``, or the refusal (:class:`SignatureInvalid`,
        :class:`SignatureUnbound`, :class:`UnknownSigner`) that says why not."""
        try:
            keys, _cas = self._load()
        except KeyringError as exc:
            raise keyring_unreadable(self.where, str(exc)) from None
        now = self._now()
        signed = statement(model, release, manifest)
        verified = [key.name for key in keys if self._keys.verifies(key.key, signed, signature)]
        unbound = []
        if not verified:  # signed the old way? said so, rather than "does not verify"
            unbound = [k.name for k in keys if self._keys.verifies(k.key, manifest, signature)]
        return judge(
            release_named(model, release),
            [key.trust(now) for key in keys],
            verified,
            unbound_by=unbound,
            malformed=not verified and not unbound and self._keys.malformed(signature),
            sign_again=signing_command(model, release),
        )

    def verify_model_signature(self, model: str, release: str, bundle: bytes) -> SignedManifest:
        """The signer and the files of ``release``'s ``model.sig`` (the bytes ``bundle``):
        key mode tries every EC key of the keyring, certificate mode walks its chain to a CA
        of ``ca/``; or the refusal (:class:`SignatureInvalid`, :class:`UnknownSigner`)."""
        where = where_named(model, release)
        parsed = parse_bundle(bundle, where)
        try:
            keys, cas = self._load()
        except KeyringError as exc:
            raise keyring_unreadable(self.where, str(exc)) from None
        if parsed.certificates:
            signer = self._model_signatures.certificate_signer(parsed, cas, where)
        else:
            now = self._now()
            verified = [k.name for k in keys if self._model_signatures.verifies(k.key, parsed)]
            signer = judge_key(where, [key.trust(now) for key in keys], verified)
        return read_manifest(parsed, where, signer)

    def _load(self) -> tuple[list[_Key], list[tuple[str, Certificate]]]:
        files: list[tuple[Path, bool]] = []
        cas: list[tuple[str, Certificate]] = []
        for path in self._paths:
            if path.is_dir():
                files += [(pem, False) for pem in _pems(path)]
                if (path / RETIRED_DIR).is_dir():
                    files += [(pem, True) for pem in _pems(path / RETIRED_DIR)]
                if (path / CA_DIR).is_dir():
                    for pem in _pems(path / CA_DIR):
                        found = self._model_signatures.read_cas(pem, _read_pem(pem))
                        cas += [(os.path.splitext(pem.name)[0], ca) for ca in found]
            elif path.exists():
                files.append((path, False))
            else:
                raise KeyringError(f"{path} does not exist")
        keys: dict[str, _Key] = {}
        for file, is_retired in files:
            key = self._read(file, is_retired)
            if key.name in keys:
                raise KeyringError(
                    f"two keys are named {key.name!r}: {keys[key.name].path} and {file}; a key "
                    "is named by its file's stem, so rename one"
                )
            keys[key.name] = key
        if not keys and not cas:
            raise KeyringError(f"no *.pem file in {self.where}")
        return list(keys.values()), cas

    def _read(self, path: Path, retired: bool) -> _Key:
        data = _read_pem(path)
        parsed = self._keys.parse(path, data)
        name = os.path.splitext(path.name)[0]
        return _Key(name, path, parsed.key, retired, parsed.not_before, parsed.not_after)


def _read_pem(path: Path) -> bytes:
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_PEM_BYTES + 1)
    except OSError as exc:
        raise KeyringError(f"{path}: {exc.strerror or exc}") from None
    if len(data) > MAX_PEM_BYTES:
        raise KeyringError(f"{path} is larger than {MAX_PEM_BYTES} bytes: no key or CA is")
    if b"PRIVATE KEY-----" in data:
        raise KeyringError(
            f"{path} holds a private key: the keyring takes public keys and certificates only "
            "(write the public part with `openssl pkey -in key.pem -pubout`); the private key "
            "belongs to the publisher alone"
        )
    return data


def _pems(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.suffix == ".pem" and p.is_file())
    except OSError as exc:
        raise KeyringError(f"{folder}: {exc.strerror or exc}") from None
