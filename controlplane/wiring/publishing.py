"""The publisher's side (``controlplane release check`` and ``release publish``), put
together: the release dir as a store, a throwaway staging area, Triton's config schema, the
store a release goes to and its signers.

A store is named as the daemon's ``store.uri`` names it (``s3://bucket/prefix``, or a
directory: a path or ``file:///abs/path``) and checked by the same rule
(:class:`~controlplane.settings.places.StoreSettings`), followed by ``/<model>/<release>``.
The S3 client is the daemon's, from the same AWS chain. ``SHA256SUMS`` is never written into
the release dir: the publisher's goes straight to the store, and a dir that ships its own has
it checked like any release's.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

from pydantic import ValidationError

from controlplane.adapters.keyring import Keyring
from controlplane.adapters.release_signers import ModelSigner, ShippedSignature, StatementSigner
from controlplane.adapters.release_tree import digests
from controlplane.adapters.staging.fs import StagingArea
from controlplane.adapters.stores.local_publish import LocalReleaseTarget
from controlplane.adapters.stores.release_dir import ReleaseDirStore
from controlplane.adapters.triton.model_config import ProtobufConfigEditor
from controlplane.domain.checksums import (
    MANIFEST_NAME,
    SIDE_FILES,
    SIGNATURE_NAME,
    render_manifest,
)
from controlplane.domain.errors import InvalidRequest
from controlplane.domain.model_signing import MAX_MODEL_SIGNATURE_BYTES, MODEL_SIGNATURE_NAME
from controlplane.domain.names import validate_model_name, validate_release_name
from controlplane.ports import ReleaseSigner, ReleaseTarget, ReleaseToPublish
from controlplane.services.prepare import SignaturePolicy
from controlplane.services.release_check import ReleaseCheck
from controlplane.settings.places import StoreSettings

# The names a check gives a release when it is not told them: valid, so only the dir is judged.
UNNAMED_MODEL = "model"
UNNAMED_RELEASE = "release"


@dataclass(frozen=True)
class Destination:
    """``STORE/MODEL/RELEASE``, split and checked."""

    store: StoreSettings
    model: str
    release: str

    @property
    def shown(self) -> str:
        return f"{self.store.uri}/{self.model}/{self.release}"


def destination(text: str) -> Destination:
    """Parse ``STORE/MODEL/RELEASE``; a store the daemon could not use, or a name it would
    refuse, is :class:`InvalidRequest` saying which."""
    parsed = urlparse(text)
    if parsed.scheme == "s3":
        head, model, release = _last_two(text)
        uri = head
    elif parsed.scheme in ("", "file"):
        path = Path(parsed.path if parsed.scheme == "file" else text)
        head, model, release = _last_two(str(path))
        uri = "file://" + os.path.abspath(head)  # as the daemon reads store.uri: no %-escapes
    else:
        raise InvalidRequest(
            f"{text!r} names no store: give STORE/MODEL/RELEASE, where STORE is a directory "
            "or s3://bucket/prefix, as the daemon's store.uri"
        )
    try:
        store = StoreSettings(uri=uri)
    except ValidationError as exc:
        reason = "; ".join(
            str(e.get("msg", "")).removeprefix("Value error, ") for e in exc.errors()
        )
        raise InvalidRequest(f"store {uri!r}: {reason}") from None
    return Destination(store, validate_model_name(model), validate_release_name(release))


def _last_two(text: str) -> tuple[str, str, str]:
    parts = text.rstrip("/").rsplit("/", 2)
    if len(parts) != 3 or not parts[0] or parts[0].endswith(":/"):
        raise InvalidRequest(
            f"{text!r} is not STORE/MODEL/RELEASE: name the store, then the model and the "
            "release below it (s3://bucket/prefix/resnet/2026-12-06.1, or "
            "/srv/models/resnet/2026-12-06.1)"
        )
    return parts[0], parts[1], parts[2]


def release_to_publish(path: Path, model: str, release: str) -> ReleaseToPublish:
    """The release in ``path``: its files hashed, and the ``SHA256SUMS`` to publish (the
    dir's own, when it ships one; else written here, in memory)."""
    files = digests(path, skip=SIDE_FILES | {MANIFEST_NAME})  # signatures go up as side files
    own = path / MANIFEST_NAME
    if own.is_file() and not own.is_symlink():
        manifest = own.read_bytes()
    else:
        manifest = render_manifest({rel: digest.sha256 for rel, digest in files.items()})
    return ReleaseToPublish(model, release, path, files, manifest)


def ships_signature(path: Path) -> bool:
    return (path / SIGNATURE_NAME).is_file()


@asynccontextmanager
async def release_check(
    path: Path,
    model: str | None,
    release: str | None,
    *,
    manifest: bytes | None,
    keyring: Path | None = None,
    require_signature: bool = False,
) -> AsyncIterator[tuple[ReleaseCheck, str, str]]:
    """A check of the release dir ``path`` (named ``model``/``release`` when given), with
    ``manifest`` as its ``SHA256SUMS`` when the dir has none, and its signature checked as
    a member with ``keyring`` (a dir of PEM files or one file, as ``store.keyring``) checks
    it; the staging area it uses lives in a temp dir, deleted after."""
    if require_signature and keyring is None:
        raise InvalidRequest(
            "--require-signature needs --keyring: the public keys a signature is checked with"
        )
    signatures = None
    if keyring is not None:
        signatures = SignaturePolicy(
            verifier=Keyring([keyring], now=lambda: datetime.now(UTC)),
            required=lambda _model: require_signature,
        )
    named_model = UNNAMED_MODEL if model is None else model
    named_release = UNNAMED_RELEASE if release is None else release
    store = ReleaseDirStore(path, named_model, named_release, manifest=manifest)
    with tempfile.TemporaryDirectory(prefix="controlplane-check-") as work:
        staging = StagingArea(Path(work) / "repository", Path(work) / "staging")
        staging.staging.mkdir()
        check = ReleaseCheck(
            store=store, staging=staging, editor=ProtobufConfigEditor(), signatures=signatures
        )
        yield check, named_model, named_release


def shown_manifest(release: ReleaseToPublish) -> bytes | None:
    """The ``SHA256SUMS`` a check shows in the dir: None when the dir ships its own (read
    and checked as a deploy does), else the one the publisher writes."""
    own = release.path / MANIFEST_NAME
    return None if own.exists() or own.is_symlink() else release.manifest


def release_target(
    where: Destination,
    *,
    retry_seconds: float | None = None,
    part_size: int | None = None,
    multipart_threshold: int | None = None,
) -> ReleaseTarget:
    store = where.store
    if store.scheme == "s3":
        from controlplane.adapters.stores.s3_publish import S3ReleaseTarget  # boto3: on demand

        return S3ReleaseTarget(
            store.uri,
            where.model,
            where.release,
            max_concurrency=store.max_concurrency,
            multipart_threshold=multipart_threshold or store.multipart_threshold_bytes,
            part_size=part_size or store.part_size_bytes,
            retry_seconds=store.retry_seconds if retry_seconds is None else retry_seconds,
        )
    return LocalReleaseTarget(store.local_path, where.model, where.release)


def signers(path: Path, key: Path | None, sign_as: str = SIGNATURE_NAME) -> Sequence[ReleaseSigner]:
    """The release's signers: the key given, making ``sign_as`` (``SHA256SUMS.sig`` or
    ``model.sig``), and the signatures the dir ships (uploaded as they are), or none. A key
    asked to make a signature the dir ships already is refused: which one counts?"""
    if key is None and sign_as != SIGNATURE_NAME:
        raise InvalidRequest(
            f"--sign-as {sign_as} needs --sign KEY: the private key to sign with (without "
            "--sign, the release goes up with the signatures its dir holds, if any)"
        )
    if sign_as not in (SIGNATURE_NAME, MODEL_SIGNATURE_NAME):
        raise InvalidRequest(
            f"--sign-as {sign_as!r}: give {SIGNATURE_NAME} or {MODEL_SIGNATURE_NAME}"
        )
    if key is not None and (path / sign_as).is_file():
        raise InvalidRequest(
            f"{path} holds a {sign_as} already, and --sign would make another: "
            "remove it, or publish without --sign to upload it as it is"
        )
    found: list[ReleaseSigner] = []
    if key is not None and sign_as == MODEL_SIGNATURE_NAME:  # first: docs/signatures.md's order
        found.append(ModelSigner(key))
    elif (path / MODEL_SIGNATURE_NAME).is_file():
        found.append(ShippedSignature(MODEL_SIGNATURE_NAME, limit=MAX_MODEL_SIGNATURE_BYTES))
    if key is not None and sign_as == SIGNATURE_NAME:
        found.append(StatementSigner(key))
    elif ships_signature(path):
        found.append(ShippedSignature())
    return found
