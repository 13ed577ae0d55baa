"""The ``signature`` step of a deploy: the release's ``SHA256SUMS`` is checked against the
publisher's signature before anything else of the release is fetched.

``SHA256SUMS`` and ``SHA256SUMS.sig`` are read once, as bytes; the signature is checked over
exactly those bytes, and the manifest the fetch works from is parsed from them, so what was
verified is what is fetched (the fetch compares the ``SHA256SUMS`` it writes with these
bytes: one swapped in between is ``release_changed``). The rules:

* a signature is required for the model (``store.require_signature`` or its own
  ``require_signature``) and there is none: ``signature_missing``;
* there is one and a keyring is set: it must verify, required or not (a signature that does
  not verify is never ignored): ``signature_invalid`` or ``unknown_signer`` otherwise;
* no signature and none required: the release deploys as it does without a keyring.

A refusal right after the release was republished (a new ``.sig`` uploaded before its new
``SHA256SUMS``) is told apart by reading both again: bytes that changed make it
``release_changed``, retried, instead of a refusal of the release.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.domain.errors import ControlPlaneError, ReleaseChanged, ReleaseIncomplete
from controlplane.domain.signatures import missing
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
    """The bytes of ``SHA256SUMS`` as read (and verified, when there is a signer)."""

    manifest: bytes | None
    signer: str | None

    @property
    def digest(self) -> str | None:
        return None if self.manifest is None else hashlib.sha256(self.manifest).hexdigest()


async def check_signature(
    tracker: OperationTracker,
    *,
    store: ModelStore,
    policy: SignaturePolicy,
    model: str,
    release: str,
) -> CheckedManifest:
    """The ``signature`` step: read both files once, verify, record the signer."""
    async with tracker.step("signature"):
        files = await asyncio.to_thread(store.read_marker_files, model, release)
        try:
            signer = await _signer(policy, files, model, release)
        except ControlPlaneError as exc:
            again = await asyncio.to_thread(store.read_marker_files, model, release)
            if again != files:
                raise ReleaseChanged(
                    f"SHA256SUMS or SHA256SUMS.sig of {model}/{release} changed while they "
                    "were checked (the release is being republished); it will be checked again"
                ) from exc
            policy.telemetry.signature_refused(model, exc.code)
            raise
        tracker.detail(signed=files.signature is not None, signer=signer)
        if signer is not None:
            tracker.operation_detail({"signer": signer})
    return CheckedManifest(files.manifest, signer)


async def _signer(
    policy: SignaturePolicy, files: MarkerFiles, model: str, release: str
) -> str | None:
    where = f"release {release!r} of {model!r}"
    if files.signature is None:
        if policy.required(model):
            raise missing(where)
        return None
    if files.manifest is None:
        if policy.required(model):
            raise ReleaseIncomplete(
                f"{where} has no SHA256SUMS, and a signature over it is required: publish "
                "SHA256SUMS.sig, then SHA256SUMS (the commit marker) last"
            )
        return None  # the fetch step says what it makes of a release without one
    if policy.verifier is None:
        return None  # no keyring (so none is required): nothing to check it with
    return await asyncio.to_thread(policy.verifier.verify, files.manifest, files.signature, where)
