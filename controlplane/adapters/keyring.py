"""The keyring of publisher keys: which keys are trusted, read from ``store.keyring``.

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

The signatures are what plain openssl writes over a release's statement (its model, its name,
then the bytes of ``SHA256SUMS``: :func:`~controlplane.domain.signatures.statement`): Ed25519
from ``openssl pkeyutl -sign -rawin`` (64 raw bytes), ECDSA P-256 with SHA-256 from
``openssl dgst -sha256 -sign`` (DER). A signature that verifies over ``SHA256SUMS`` alone
instead was made the old way, and is refused as such (``signature_unbound``).
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

from controlplane.domain.signatures import (
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
        from controlplane.adapters import publisher_keys  # cryptography: only with a keyring

        self._keys = publisher_keys.PemKeys()
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

    def verify_release(self, model: str, release: str, manifest: bytes, signature: bytes) -> str:
        """The name of the trusted key whose ``signature`` is over ``release`` of ``model``
        with the ``SHA256SUMS`` bytes ``manifest``, or the refusal (:class:`SignatureInvalid`,
        :class:`SignatureUnbound`, :class:`UnknownSigner`) that says why not."""
        try:
            keys = self._load()
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
            key = self._read(file, is_retired)
            if key.name in keys:
                raise KeyringError(
                    f"two keys are named {key.name!r}: {keys[key.name].path} and {file}; a key "
                    "is named by its file's stem, so rename one"
                )
            keys[key.name] = key
        if not keys:
            raise KeyringError(f"no *.pem file in {self.where}")
        return list(keys.values())

    def _read(self, path: Path, retired: bool) -> _Key:
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
        parsed = self._keys.parse(path, data)
        name = os.path.splitext(path.name)[0]
        return _Key(name, path, parsed.key, retired, parsed.not_before, parsed.not_after)


def _pems(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.suffix == ".pem" and p.is_file())
    except OSError as exc:
        raise KeyringError(f"{folder}: {exc.strerror or exc}") from None
