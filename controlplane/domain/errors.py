"""The project's error hierarchy, with machine-readable codes.

Every failure that can reach a user carries a stable ``code`` (``checksum_mismatch``,
``triton_load_failed``, ...) and a message that says what is wrong and what to do. Whether a
failure is worth retrying is part of its type, never a guess at the call site::

    ControlPlaneError
    ├── PermanentError            retrying cannot help
    │   ├── InvalidName            invalid_name
    │   ├── ModelNotFound          model_not_found
    │   ├── ReleaseNotFound        release_not_found
    │   ├── ReleaseIncomplete      release_incomplete
    │   ├── ReleaseExists          release_exists    (publish: the release has its SHA256SUMS:
    │   │                                             it is immutable)
    │   ├── ChecksumMismatch       checksum_mismatch
    │   ├── SignatureMissing       signature_missing (a signature is required, none was published)
    │   ├── SignatureInvalid       signature_invalid (no key of the keyring verifies it)
    │   ├── SignatureUnbound       signature_unbound (signed the old way: over SHA256SUMS
    │   │                                             alone, naming no model or release)
    │   ├── UnknownSigner          unknown_signer    (signed by a key not trusted now)
    │   ├── ReleaseBelowFloor      release_below_floor (older than the model's min_release)
    │   ├── UnsafeRelease          invalid_release   (symlinks, '..', absolute paths, extra files,
    │   │                                             Python that does not compile)
    │   ├── InvalidModelConfig     invalid_model_config
    │   ├── TritonLoadFailed       triton_load_failed
    │   ├── TritonError            triton_error      (Triton refused a call)
    │   ├── OperationInProgress    operation_in_progress
    │   ├── OperationNotFound      operation_not_found
    │   ├── NoPreviousRelease      no_previous_release
    │   ├── InvalidTransition      invalid_transition
    │   ├── PreflightFailed        preflight_failed  (smoke inference failed or answered wrong,
    │   │                                             or the stress test refused the release)
    │   ├── UnsupportedByAlias     strategy_unsupported (blue-green cannot front the model)
    │   ├── StagingFailed          staging_failed
    │   ├── NameConflict           name_conflict     (the repository dir belongs to another model)
    │   ├── InsufficientMemory     insufficient_memory
    │   ├── MemoryNotReturned      memory_not_returned (rolling: the old release's GPU memory
    │   │                                             did not come back after its unload)
    │   ├── DowntimeRefused        would_be_an_outage (rolling in a fleet of one)
    │   ├── InsufficientDisk       insufficient_disk (staging has no room for the fetch)
    │   ├── ReleaseTooLarge        release_too_large (over store.max_release_bytes)
    │   ├── NoFallback             no_fallback
    │   ├── InvalidRequest         invalid_request
    │   ├── DesiredStateConflict   desired_state_conflict (another member changed the fleet's
    │   │                                             desired state first)
    │   ├── MemberFailed           member_failed     (a member of the fleet could not follow)
    │   ├── NoRolloutInProgress    no_rollout_in_progress (a rollout control found nothing
    │   │                                             to pause, promote or abort)
    │   ├── RolloutNotPaused       rollout_not_paused (resume of a rollout nobody paused)
    │   ├── RolloutAlreadyPaused   rollout_already_paused (pause of a paused one: by whom)
    │   └── StoreError             store_error       (the store refused: access denied, ...)
    └── TransientError            a later attempt may succeed
        ├── TritonUnavailable      triton_unavailable
        ├── TritonTimeout          triton_timeout
        ├── StoreUnavailable       store_unavailable (throttled, 5xx, dropped connections,
        │                                             bytes corrupted on the wire)
        ├── ReleaseChanged         release_changed   (objects changed during the download)
        ├── FleetTimeout           fleet_timeout     (members did not follow within the bound)
        └── Interrupted            interrupted       (cancelled: shutdown, a fetch stopped)

HTTP status codes are not known here: ``api/errors.py`` holds the one table from code to status.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar


class ControlPlaneError(Exception):
    """Base of every error the control plane reports to a user."""

    code: ClassVar[str] = "internal_error"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, details: Mapping[str, object] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, object] = dict(details or {})

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class PermanentError(ControlPlaneError):
    """The same request will fail the same way until something outside changes."""


class TransientError(ControlPlaneError):
    """A later attempt may succeed; callers may retry with backoff."""

    retryable = True


class InvalidName(PermanentError):
    code = "invalid_name"


class ModelNotFound(PermanentError):
    code = "model_not_found"


class ReleaseNotFound(PermanentError):
    code = "release_not_found"


class ReleaseIncomplete(PermanentError):
    code = "release_incomplete"


class ReleaseExists(PermanentError):
    """A publish found the release already committed (its ``SHA256SUMS`` is in the store):
    a release is immutable, so publish a new one under a new name."""

    code = "release_exists"


class ChecksumMismatch(PermanentError):
    code = "checksum_mismatch"


class SignatureMissing(PermanentError):
    """A signature is required (``store.require_signature``) and the release has no
    ``SHA256SUMS.sig``."""

    code = "signature_missing"


class SignatureInvalid(PermanentError):
    """``SHA256SUMS.sig`` is malformed, or no key of the keyring verifies it over the release's
    statement (its model, its name and the bytes of ``SHA256SUMS``), or the keyring cannot be
    read: nothing is trusted then."""

    code = "signature_invalid"


class SignatureUnbound(PermanentError):
    """A key of the keyring verifies ``SHA256SUMS.sig`` over the bytes of ``SHA256SUMS`` alone,
    not over the statement that names the model and the release: signed the old way, so it
    would verify under any name the release is copied to."""

    code = "signature_unbound"


class UnknownSigner(PermanentError):
    """A key the keyring holds but does not trust now (retired, its certificate expired or not
    yet valid) verifies the signature."""

    code = "unknown_signer"


class ReleaseBelowFloor(PermanentError):
    """The release sorts before the model's ``min_release``: it may not serve."""

    code = "release_below_floor"


class UnsafeRelease(PermanentError):
    code = "invalid_release"


class InvalidModelConfig(PermanentError):
    code = "invalid_model_config"


class TritonLoadFailed(PermanentError):
    code = "triton_load_failed"


class TritonError(PermanentError):
    code = "triton_error"


class OperationInProgress(PermanentError):
    code = "operation_in_progress"


class OperationNotFound(PermanentError):
    code = "operation_not_found"


class NoPreviousRelease(PermanentError):
    code = "no_previous_release"


class InvalidTransition(PermanentError):
    code = "invalid_transition"


class PreflightFailed(PermanentError):
    code = "preflight_failed"


class UnsupportedByAlias(PermanentError):
    code = "strategy_unsupported"


class StagingFailed(PermanentError):
    code = "staging_failed"


class InsufficientDisk(PermanentError):
    """The staging filesystem cannot hold what a fetch would write (figures in ``details``)."""

    code = "insufficient_disk"


class ReleaseTooLarge(PermanentError):
    """The release is larger than ``store.max_release_bytes``, wherever it is deployed."""

    code = "release_too_large"


class TritonUnavailable(TransientError):
    code = "triton_unavailable"


class TritonTimeout(TransientError):
    code = "triton_timeout"


class StoreError(PermanentError):
    code = "store_error"


class StoreUnavailable(TransientError):
    code = "store_unavailable"


class ReleaseChanged(TransientError):
    code = "release_changed"


class Superseded(TransientError):
    """The fleet's desired release moved on while this member waited to follow it (for a turn
    out of rotation): nothing was unloaded, and the member follows the new one instead."""

    code = "superseded"


class Interrupted(TransientError):
    """The work was cancelled before it finished (shutdown, or its operation was cut short)."""

    code = "interrupted"


class InvalidRequest(PermanentError):
    code = "invalid_request"


class NoFallback(PermanentError):
    code = "no_fallback"


class InsufficientMemory(PermanentError):
    code = "insufficient_memory"


class MemoryNotReturned(PermanentError):
    """After an unload, the GPU memory the old release held did not come back in time: a load
    now would run out of memory."""

    code = "memory_not_returned"


class DowntimeRefused(PermanentError):
    """An update that would stop the model serving (a fleet of one, a model that fits once)."""

    code = "would_be_an_outage"


class NameConflict(PermanentError):
    code = "name_conflict"


class DesiredStateConflict(PermanentError):
    """The fleet's desired state of a model changed since this request read it: another
    member (or request) won the compare-and-swap. ``details`` say who set what."""

    code = "desired_state_conflict"


class MemberFailed(PermanentError):
    """A member of the fleet failed to serve the desired release (``details``: each member)."""

    code = "member_failed"


class NoRolloutInProgress(PermanentError):
    """A rollout control (pause, promote, abort) found nothing of the model's to act on."""

    code = "no_rollout_in_progress"


class RolloutNotPaused(PermanentError):
    """``resume`` of a model whose rollout nobody paused."""

    code = "rollout_not_paused"


class RolloutAlreadyPaused(PermanentError):
    """``pause`` of a rollout that is paused already (the message says by whom, and why)."""

    code = "rollout_already_paused"


class FleetTimeout(TransientError):
    """Live members did not all serve the desired release within the wait's bound."""

    code = "fleet_timeout"
