"""The signers of ``controlplane release publish``: one per signature scheme, each making
one side file of the release (:class:`~controlplane.ports.ReleaseSigner`).

:class:`StatementSigner` is the scheme of docs/signatures.md: ``SHA256SUMS.sig`` over the
statement that names the model and the release followed by the bytes of ``SHA256SUMS``
(:func:`controlplane.domain.signatures.statement`), exactly what the openssl commands there
sign, so a member's keyring verifies it as it verifies theirs. :class:`ModelSigner` writes
OpenSSF Model Signing's ``model.sig`` (key mode) as ``model_signing sign key`` would.
:class:`ShippedSignature` uploads a signature the release dir already holds (signed
elsewhere): a ``SHA256SUMS.sig``, or a ``model.sig``.
"""

from __future__ import annotations

from pathlib import Path

from controlplane.adapters.keyring import KeyringError
from controlplane.domain.checksums import SIGNATURE_NAME
from controlplane.domain.errors import InvalidRequest
from controlplane.domain.model_signing import MODEL_SIGNATURE_NAME, key_bundle
from controlplane.domain.model_signing import statement as model_statement
from controlplane.domain.signatures import MAX_SIGNATURE_BYTES, statement
from controlplane.ports import ReleaseToPublish, SideFile


class StatementSigner:
    """Signs with a private key (PEM, Ed25519 or ECDSA P-256); the signer is its file's stem,
    as a member's keyring names the public half."""

    def __init__(self, key: Path) -> None:
        self._key = key

    def sign(self, release: ReleaseToPublish) -> SideFile:
        from controlplane.adapters.publisher_keys import sign_with  # cryptography: on demand

        signed = statement(release.model, release.release, release.manifest)
        try:
            data = sign_with(self._key, signed)
        except KeyringError as exc:
            raise InvalidRequest(f"--sign: {exc}") from None
        return SideFile(SIGNATURE_NAME, data, signer=self._key.stem)


class ModelSigner:
    """Signs as ``model_signing sign key`` does, with an EC P-256 or P-384 private key:
    ``model.sig`` over the release's files (not ``SHA256SUMS``), whose subject is named
    ``MODEL/RELEASE``; the signer is the key file's stem, as a member's keyring names the
    public half."""

    def __init__(self, key: Path) -> None:
        self._key = key

    def sign(self, release: ReleaseToPublish) -> SideFile:
        from controlplane.adapters.publisher_keys import sign_model  # cryptography: on demand

        digests = {rel: digest.sha256 for rel, digest in release.files.items()}
        payload = model_statement(f"{release.model}/{release.release}", digests)
        try:
            signature, hint = sign_model(self._key, payload)
        except KeyringError as exc:
            raise InvalidRequest(f"--sign: {exc}") from None
        return SideFile(MODEL_SIGNATURE_NAME, key_bundle(payload, signature, hint), self._key.stem)


class ShippedSignature:
    """A signature file the release dir holds already (``SHA256SUMS.sig``, or Model Signing's
    ``model.sig``, as NGC ships it), uploaded as it is, after the files and before the
    marker: a member hears of a release by either, so neither may land before the files."""

    def __init__(self, name: str = SIGNATURE_NAME, *, limit: int = MAX_SIGNATURE_BYTES) -> None:
        self._name, self._limit = name, limit

    def sign(self, release: ReleaseToPublish) -> SideFile:
        path = release.path / self._name
        data = path.read_bytes()
        if len(data) > self._limit:
            raise InvalidRequest(
                f"{path} is {len(data)} bytes; a signature has at most {self._limit}"
            )
        return SideFile(self._name, data, signer="shipped in the release dir")
