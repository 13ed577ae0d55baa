"""``controlplane release check|publish``: the publisher's commands, for CI. Offline (check)
or against the store alone (publish): no daemon is called.

Exit codes, as the client commands': 0 the release passed (and was published); 1 it was
refused, with the deploy's own error code and message (``error: invalid_release: ...``, or
``error`` in the ``-o json`` document), or the store refused or did not answer; 2 bad usage
(a DIR that is no directory, a destination that names no store, ``--sign`` beside a shipped
signature).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from controlplane.cli.options import OutputOption
from controlplane.cli.output import EXIT_FAILED, EXIT_USAGE, Format, Out
from controlplane.domain.errors import ControlPlaneError, InvalidName, InvalidRequest

if TYPE_CHECKING:
    from controlplane.services.publish import PublishedRelease
    from controlplane.services.release_check import CheckedRelease

T = TypeVar("T")


class SignAs(StrEnum):
    """The signature ``release publish --sign`` makes."""

    SUMS = "SHA256SUMS.sig"
    MODEL = "model.sig"


app = typer.Typer(
    help="Check a release dir as a deploy would, offline, and publish it to a store.",
    no_args_is_help=True,
)

DirArgument = Annotated[
    Path,
    typer.Argument(
        metavar="DIR",
        help="The release: a Triton model dir (config.pbtxt, 1/, ...), with or without its "
        "SHA256SUMS.",
        show_default=False,
    ),
]


@app.command("check")
def check(
    path: DirArgument,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="The model it will be published as: its name is checked too.",
        ),
    ] = None,
    release: Annotated[
        str | None,
        typer.Option(
            "--release",
            help="The release name it will be published as: checked too.",
        ),
    ] = None,
    keyring: Annotated[
        Path | None,
        typer.Option(
            "--keyring",
            help="Check SHA256SUMS.sig as a member with this store.keyring does (a dir of "
            "PEM public keys, or one PEM file): a signature that does not verify is refused.",
            show_default=False,
        ),
    ] = None,
    require_signature: Annotated[
        bool,
        typer.Option(
            "--require-signature",
            help="With --keyring: refuse a release without SHA256SUMS.sig (signature_missing), "
            "as store.require_signature does.",
        ),
    ] = False,
    output: OutputOption = Format.TABLE,
) -> None:
    """Run every check a deploy makes before it needs Triton, offline: the names, SHA256SUMS
    (written as publish writes it, when DIR has none) and the files it lists, no symlinks or
    '..', config.pbtxt against Triton's schema, Python that compiles, smoke.json. Exits 1
    with the deploy's own error code and message when one refuses."""
    out = Out(output)
    _need_dir(path)
    checked = _run(out, _check(path, model, release, keyring, require_signature))
    document = {**_checked_document(path, checked), "model": model, "release": release}
    out.show(document, _checked_lines(path, checked))


@app.command("publish")
def publish(
    path: DirArgument,
    destination: Annotated[
        str,
        typer.Argument(
            metavar="STORE/MODEL/RELEASE",
            help="Where: the store as the daemon's store.uri names it (a directory, or "
            "s3://bucket/prefix), then the model and the release.",
            show_default=False,
        ),
    ],
    sign: Annotated[
        Path | None,
        typer.Option(
            "--sign",
            metavar="KEY",
            help="Sign it with this private key (PEM): SHA256SUMS.sig (Ed25519 or ECDSA "
            "P-256), as docs/signatures.md's openssl commands make it, or model.sig with "
            "--sign-as.",
        ),
    ] = None,
    sign_as: Annotated[
        SignAs,
        typer.Option(
            "--sign-as",
            help="The signature --sign makes: SHA256SUMS.sig, or model.sig (OpenSSF Model "
            "Signing's key mode, ECDSA P-256 or P-384, as 'model_signing sign key' writes it).",
        ),
    ] = SignAs.SUMS,
    retry_seconds: Annotated[
        float | None,
        typer.Option(
            "--retry-seconds",
            min=0,
            help="S3: how long one request may keep failing transiently before the publish "
            "fails (default: store.retry_seconds's, 120).",
            show_default=False,
        ),
    ] = None,
    part_size: Annotated[
        int | None,
        typer.Option(
            "--part-size",
            min=5 * 1024 * 1024,
            help="S3: the size of each part of a multipart upload (default: "
            "store.part_size_bytes's, 16 MiB).",
            show_default=False,
        ),
    ] = None,
    multipart_threshold: Annotated[
        int | None,
        typer.Option(
            "--multipart-threshold",
            min=5 * 1024 * 1024,
            help="S3: files at least this large go up in parts (default: "
            "store.multipart_threshold_bytes's, 64 MiB).",
            show_default=False,
        ),
    ] = None,
    output: OutputOption = Format.TABLE,
) -> None:
    """Check the release (as 'release check'), then upload it: every file, then the
    signature, then SHA256SUMS last, the commit marker a member waits for. A release already
    published is refused (release_exists: releases are immutable); a publish that was cut
    before its SHA256SUMS is completed by running it again."""
    from controlplane.wiring import publishing

    out = Out(output)
    _need_dir(path)
    try:
        where = publishing.destination(destination)
        signers = publishing.signers(path, sign, sign_as.value)
    except ControlPlaneError as exc:
        raise _usage(exc.code, exc.message) from None

    async def run() -> PublishedRelease:
        from controlplane.services.publish import publish_release

        release = await asyncio.to_thread(
            publishing.release_to_publish, path, where.model, where.release
        )
        target = publishing.release_target(
            where,
            retry_seconds=retry_seconds,
            part_size=part_size,
            multipart_threshold=multipart_threshold,
        )

        async def check_first() -> CheckedRelease:
            async with publishing.release_check(
                path, where.model, where.release, manifest=publishing.shown_manifest(release)
            ) as (checker, model, name):
                checked = await checker.run(model, name)
            out.say(f"checked {path}: {checked.files} files, {checked.bytes} bytes")
            return checked

        out.say(f"publishing {path} to {where.shown}")
        return await publish_release(
            release, check=check_first, target=target, signers=signers, say=out.say
        )

    published = _run(out, run())
    document = {
        "published": published.uri,
        "model": where.model,
        "release": where.release,
        "files": published.checked.files,
        "bytes": published.checked.bytes,
        "uploaded": list(published.uploaded),
        "kept": list(published.kept),
        "removed": list(published.removed),
        "signed_by": list(published.signed_by),
    }
    out.show(
        document,
        [
            f"published {where.model}/{where.release} at {published.uri}: "
            f"{len(published.uploaded)} files uploaded, {len(published.kept)} kept from an "
            "earlier run"
        ],
    )


async def _check(
    path: Path,
    model: str | None,
    release: str | None,
    keyring: Path | None,
    require_signature: bool,
) -> CheckedRelease:
    from controlplane.wiring import publishing

    publish_as = publishing.release_to_publish(
        path, model or publishing.UNNAMED_MODEL, release or publishing.UNNAMED_RELEASE
    )
    async with publishing.release_check(
        path,
        model,
        release,
        manifest=publishing.shown_manifest(publish_as),
        keyring=keyring,
        require_signature=require_signature,
    ) as (checker, named_model, named_release):
        return await checker.run(named_model, named_release)


def _run(out: Out, work: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(work)
    except (InvalidRequest, InvalidName) as exc:  # bad usage: nothing was read or written
        raise _usage(exc.code, exc.message) from None
    except ControlPlaneError as exc:
        body = {"details": exc.details} if exc.details else None
        raise out.fail(EXIT_FAILED, exc.code, exc.message, body) from None


def _need_dir(path: Path) -> None:
    if not path.is_dir() or path.is_symlink():
        raise _usage(
            "invalid_request",
            f"{path} is not a directory: give the release dir (config.pbtxt, 1/, ...)",
        )


def _usage(code: str, message: str) -> typer.Exit:
    """Bad usage: said on stderr, nothing on stdout (as for every client command)."""
    typer.echo(f"error: {code}: {message}", err=True)
    return typer.Exit(EXIT_USAGE)


def _checked_document(path: Path, checked: CheckedRelease) -> dict[str, Any]:
    return {
        "ok": True,
        "path": str(path),
        "model": checked.model,
        "release": checked.release,
        "files": checked.files,
        "bytes": checked.bytes,
        "backend": checked.backend,
        "smoke": checked.smoke,
        "steps": [
            {"name": step.name, "status": step.status.value, "detail": dict(step.detail)}
            for step in checked.steps
        ],
    }


def _checked_lines(path: Path, checked: CheckedRelease) -> list[str]:
    lines = [f"  ok  {step.name}" for step in checked.steps]
    lines.append(
        f"ok: {path} passes every check a deploy makes before Triton ({checked.files} files, "
        f"{checked.bytes} bytes, backend {checked.backend}, smoke input: {checked.smoke})"
    )
    return lines
