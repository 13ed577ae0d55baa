"""The ``signature`` step of a deploy: who published the release, checked before anything else
of it is fetched, and the manifest the fetch then works from.

A release proves its publisher in one of two ways, or both:

* ``SHA256SUMS.sig``: the publisher's openssl signature over a statement naming the model, the
  release and the bytes of ``SHA256SUMS`` (:mod:`controlplane.domain.signatures`);
* ``model.sig``: OpenSSF Model Signing's bundle (``model_signing sign key|certificate``, as NGC
  publishes models), whose signed statement lists every file's SHA-256
  (:mod:`controlplane.domain.model_signing`). Such a release needs no ``SHA256SUMS``: the files
  ``model.sig`` lists are its manifest.

The rules, for a model with a signature step (a keyring is set, or a signature required):

* a signature is required for the model (``store.require_signature`` or its own
  ``require_signature``) and the release has neither: ``signature_missing``;
* each one the release has is verified, required or not (a signature that does not verify is
  never ignored): ``signature_invalid``, ``signature_unbound`` or ``unknown_signer`` otherwise;
* a release with both is checked against both, and ``SHA256SUMS`` must list what ``model.sig``
  lists (``signature_invalid`` otherwise, naming the files that differ);
* no signature and none required: the release deploys as it does without a keyring.

The marker files are read once, as bytes (:meth:`~controlplane.ports.ModelStore.read_marker_files`);
what is verified is exactly what the fetch works from. A refusal right after the release was
republished (a new signature uploaded before its new ``SHA256SUMS``) is told apart by reading
them again: bytes that changed make it ``release_changed``, retried, instead of a refusal.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from controlplane.domain.checksums import MANIFEST_NAME, SIGNATURE_NAME, decode_manifest
from controlplane.domain.errors import (
    ControlPlaneError,
    ReleaseChanged,
    ReleaseIncomplete,
    SignatureInvalid,
)
from controlplane.domain.model_signing import (
    MODEL_SIGNATURE_NAME,
    SignedManifest,
    disagreement,
    parse_bundle,
    read_manifest,
    where_named,
)
from controlplane.domain.signatures import missing, release_named
from controlplane.ports import MarkerFiles, ModelStore, SignatureVerifier, Telemetry
from controlplane.services.telemetry import NO_TELEMETRY
from controlplane.services.tracker import OperationTracker


@dataclass(frozen=True)
class SignaturePolicy:
    """Whether each model needs a signature, and the keyring that checks them (None: no
    ``store.keyring``; then no model needs one, which the settings guarantee)."""

    verifier: SignatureVerifier | None = None
    required: Callable[[str], bool] = lambda _model: False
    telemetry: Telemetry = NO_TELEMETRY

    def applies(self, model: str) -> bool:
        """Whether a deploy of ``model`` has a signature step at all."""
        return self.verifier is not None or self.required(model)


@dataclass(frozen=True)
class CheckedManifest:
    """The bytes of ``SHA256SUMS`` as read (and verified, when there is a signer), and the
    files a ``model.sig`` lists (verified, or only read where no keyring is set)."""

    manifest: bytes | None
    signer: str | None
    signed_files: Mapping[str, str] | None = None

    @property
    def digest(self) -> str | None:
        return None if self.manifest is None else hashlib.sha256(self.manifest).hexdigest()

    def files(self, where: str) -> dict[str, str] | None:
        """The manifest the fetch works from: ``SHA256SUMS``, else ``model.sig``'s files."""
        if self.manifest is not None:
            return decode_manifest(self.manifest, where)
        return None if self.signed_files is None else dict(self.signed_files)

    @property
    def named(self) -> str:
        """How refusals name the manifest."""
        if self.manifest is None and self.signed_files is not None:
            return MODEL_SIGNATURE_NAME
        return MANIFEST_NAME


async def read_unchecked(store: ModelStore, model: str, release: str) -> CheckedManifest:
    """The markers of a release deployed with no signature step (no keyring, none required):
    ``SHA256SUMS``, or the files its ``model.sig`` lists, read but not verified (as an unsigned
    ``SHA256SUMS`` is: they catch a damaged file, not a forged one)."""
    files = await asyncio.to_thread(store.read_marker_files, model, release)
    listed = None
    if files.manifest is None and files.model_signature is not None:
        where = where_named(model, release)
        listed = read_manifest(parse_bundle(files.model_signature, where), where, "").files
    return CheckedManifest(files.manifest, None, listed)


async def check_signature(
    tracker: OperationTracker,
    *,
    store: ModelStore,
    policy: SignaturePolicy,
    model: str,
    release: str,
) -> CheckedManifest:
    """The ``signature`` step: read the markers once, verify, record the signer."""
    async with tracker.step("signature"):
        files = await asyncio.to_thread(store.read_marker_files, model, release)
        try:
            signer, signed = await asyncio.to_thread(_signers, policy, files, model, release)
        except ControlPlaneError as exc:
            again = await asyncio.to_thread(store.read_marker_files, model, release)
            if again != files:
                raise ReleaseChanged(
                    f"the signature files of {model}/{release} changed while they were checked "
                    "(the release is being republished); it will be checked again"
                ) from exc
            policy.telemetry.signature_refused(model, exc.code)
            raise
        present = files.signature is not None or files.model_signature is not None
        tracker.detail(signed=present, signer=signer)
        if files.model_signature is not None:
            with_ = [MODEL_SIGNATURE_NAME] + ([SIGNATURE_NAME] if files.signature else [])
            tracker.detail(signed_with=with_)
        if signer is not None:
            tracker.operation_detail({"signer": signer})
    listed = None if signed is None else signed.files
    if listed is None and files.manifest is None and files.model_signature is not None:
        where = where_named(model, release)  # no keyring: read, not verified
        listed = read_manifest(parse_bundle(files.model_signature, where), where, "").files
    return CheckedManifest(files.manifest, signer, listed)


def _signers(
    policy: SignaturePolicy, files: MarkerFiles, model: str, release: str
) -> tuple[str | None, SignedManifest | None]:
    """The signer of the release (both, joined, when its two signatures name different
    ones) and what its ``model.sig`` says; or the refusal."""
    where = release_named(model, release)
    if files.signature is None and files.model_signature is None:
        if policy.required(model):
            raise missing(where)
        return None, None
    if policy.verifier is None:
        return None, None  # no keyring (so none is required): nothing to check it with
    signers: list[str] = []
    signed = None
    if files.model_signature is not None:
        signed = policy.verifier.verify_model_signature(model, release, files.model_signature)
        _agree(signed, files, model, release)
        signers.append(signed.signer)
    if files.signature is not None:
        if files.manifest is None:
            if signed is None and not policy.required(model):
                return None, None  # the fetch step says what it makes of a release without one
            raise ReleaseIncomplete(
                f"{where} has {SIGNATURE_NAME} but no {MANIFEST_NAME}, and a signature over it "
                f"is required: publish {SIGNATURE_NAME}, then {MANIFEST_NAME} (the commit "
                "marker) last"
            )
        signers.append(
            policy.verifier.verify_release(model, release, files.manifest, files.signature)
        )
    return ", ".join(dict.fromkeys(signers)), signed


def _agree(signed: SignedManifest, files: MarkerFiles, model: str, release: str) -> None:
    """A ``model.sig`` and the release's other markers describe the same release: the
    markers it lists have the bytes read, and ``SHA256SUMS`` lists the files it lists."""
    where = where_named(model, release)
    read = {MANIFEST_NAME: files.manifest, SIGNATURE_NAME: files.signature}
    for rel, digest in signed.markers.items():
        data = read.get(rel)
        if data is None or hashlib.sha256(data).hexdigest() != digest:
            raise SignatureInvalid(
                f"{where} lists {rel} with a digest its {rel} does not have: {rel} changed "
                f"after the release was signed; sign it again (or sign before writing {rel})",
                details={"files": [rel]},
            )
    if files.manifest is not None:
        disagreement(where, decode_manifest(files.manifest, f"{model}/{release}"), signed.files)
