"""The ``SHA256SUMS`` manifest: parsing, path safety, and comparison with what the store
lists and what was fetched.

The publisher writes ``SHA256SUMS`` last (coreutils ``sha256sum`` format, paths relative to
the release dir); its presence is the commit marker of a release. Every path it names is
checked here before anything is written under it: no absolute paths, no ``..``, no empty or
``.`` components, no backslashes. It also decides what a fetch copies: the files it lists,
and nothing else (:func:`select_files`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from controlplane.domain.errors import ChecksumMismatch, ReleaseChanged, UnsafeRelease

MANIFEST_NAME = "SHA256SUMS"
# The publisher's signature of SHA256SUMS (domain/signatures.py): a side file beside it, never
# listed in it and never fetched with the release.
SIGNATURE_NAME = f"{MANIFEST_NAME}.sig"
MAX_MANIFEST_BYTES = 16 * 1024 * 1024  # a million files' worth; beyond it, a mistake or worse
_LINE = re.compile(r"([0-9a-fA-F]{64}) [ *](.+)")


def safe_relpath(path: str) -> PurePosixPath:
    """Return ``path`` as a relative POSIX path, refusing anything that could escape its root."""
    if not path or "\\" in path or "\x00" in path:
        raise UnsafeRelease(f"path {path!r} is not allowed in a release")
    pure = PurePosixPath(path)
    if pure.is_absolute():
        raise UnsafeRelease(f"absolute path {path!r} is not allowed in a release")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise UnsafeRelease(
            f"path {path!r} is not allowed in a release: no '..', '.' or empty components"
        )
    return pure


def decode_manifest(data: bytes, where: str) -> dict[str, str]:
    """Parse the bytes of ``SHA256SUMS`` (``where`` names it in messages)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnsafeRelease(
            f"{MANIFEST_NAME} of {where} is not UTF-8 text (byte 0x{data[exc.start]:02x} at "
            f"offset {exc.start}); write it with sha256sum and publish it again"
        ) from None
    return parse_manifest(text)


def render_manifest(digests: Mapping[str, str]) -> bytes:
    """``SHA256SUMS`` for ``digests`` (relative path -> sha256), as ``sha256sum`` writes it
    from inside the release dir: one ``<sha256>  <path>`` line per file, sorted by path.

    What a publisher writes (``controlplane release publish``); a deploy parses it with
    :func:`decode_manifest`. A path ``sha256sum`` would have to escape (a line break or a
    backslash in it) is refused, as every unsafe path is."""
    lines = []
    for rel in sorted(digests):
        safe_relpath(rel)
        if "\n" in rel or "\r" in rel:
            raise UnsafeRelease(f"path {rel!r} is not allowed in a release: it has a line break")
        if rel in (MANIFEST_NAME, SIGNATURE_NAME):
            raise UnsafeRelease(f"{MANIFEST_NAME} does not list {rel}")
        lines.append(f"{digests[rel].lower()}  {rel}\n")
    if not lines:
        raise UnsafeRelease(f"the release holds no files, so {MANIFEST_NAME} would list none")
    return "".join(lines).encode("utf-8")


def manifest_too_large(size: int, where: str) -> UnsafeRelease:
    return UnsafeRelease(
        f"{MANIFEST_NAME} of {where} is {size} bytes, more than the {MAX_MANIFEST_BYTES} a "
        "manifest may have; it is read into memory, so it is refused"
    )


def parse_manifest(text: str) -> dict[str, str]:
    """Parse ``SHA256SUMS`` text into ``{relative path: lowercase sha256}``."""
    entries: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        match = _LINE.fullmatch(line)
        if match is None:
            raise UnsafeRelease(
                f"{MANIFEST_NAME} line {number} is not '<sha256>  <path>': {line[:120]!r}"
            )
        digest, path = match.group(1).lower(), match.group(2)
        if path.startswith("./"):
            raise UnsafeRelease(
                f"{MANIFEST_NAME} line {number} names {path[:120]!r}: paths are relative to the "
                f"release dir without a leading './' (write it from inside the release dir "
                f"with `sha256sum 1/model.py config.pbtxt ...`, not `find . | xargs sha256sum`)"
            )
        rel = str(safe_relpath(path))
        if rel == MANIFEST_NAME:
            raise UnsafeRelease(f"{MANIFEST_NAME} must not list itself (line {number})")
        if rel in entries:
            raise UnsafeRelease(f"{MANIFEST_NAME} lists {rel!r} twice (line {number})")
        entries[rel] = digest
    if not entries:
        raise UnsafeRelease(f"{MANIFEST_NAME} lists no files")
    return entries


@dataclass(frozen=True)
class FileDigest:
    """One fetched file: its size and the SHA256 computed while it was written."""

    size: int
    sha256: str


# Never copied with a release: signatures, read and checked before the fetch (OpenSSF Model
# Signing's bundle: domain/model_signing.py).
SIDE_FILES = frozenset({SIGNATURE_NAME, "model.sig"})


def select_files(
    manifest: Mapping[str, str] | None,
    listed: Mapping[str, int],
    *,
    with_sums: bool = True,
    named: str = MANIFEST_NAME,
) -> dict[str, int]:
    """What a fetch copies, chosen from the store's listing (path -> size) before a byte is
    copied: the files ``manifest`` lists and ``SHA256SUMS`` itself, or, for a release without
    a manifest, everything listed. The signatures (``SHA256SUMS.sig``, ``model.sig``) are
    never copied (they were read and checked before, when a signature is checked at all) and
    are no extra files. ``with_sums`` false: ``manifest`` is a ``model.sig``'s, and the
    release's ``SHA256SUMS`` (none, or one published since it was read) is not copied.
    ``named``: the manifest as refusals name it.

    A listing with files the manifest does not list is refused (``invalid_release``, naming
    them), and so is one that lacks a file it lists (``checksum_mismatch``).
    """
    if manifest is None:
        return {rel: size for rel, size in listed.items() if rel not in SIDE_FILES}
    if not with_sums:
        _refuse_missing(sorted(set(manifest) - set(listed)), named)
        _refuse_unlisted(sorted(set(listed) - set(manifest) - {MANIFEST_NAME} - SIDE_FILES), named)
        return {rel: size for rel, size in listed.items() if rel in manifest}
    if MANIFEST_NAME not in listed:
        raise ReleaseChanged(
            f"{MANIFEST_NAME} is no longer in the store's listing after it was read: the release "
            "is being republished; it will be fetched again"
        )
    if listed[MANIFEST_NAME] > MAX_MANIFEST_BYTES:
        raise manifest_too_large(listed[MANIFEST_NAME], "the release")
    _refuse_missing(sorted(set(manifest) - set(listed)), named)
    _refuse_unlisted(sorted(set(listed) - set(manifest) - {MANIFEST_NAME} - SIDE_FILES), named)
    return {rel: size for rel, size in listed.items() if rel in manifest or rel == MANIFEST_NAME}


def compare_manifest(
    expected: Mapping[str, str],
    fetched: Mapping[str, FileDigest],
    named: str = MANIFEST_NAME,
) -> None:
    """Check the fetched files against the manifest (``named``: ``SHA256SUMS`` or the
    ``model.sig`` it came from): nothing missing, extra or different."""
    wrong = sorted(p for p in expected if p in fetched and fetched[p].sha256 != expected[p])
    if wrong:
        raise ChecksumMismatch(
            f"{len(wrong)} file(s) do not match {named}: {', '.join(wrong[:5])}; "
            "republish the release or fix the manifest",
            details={"files": wrong},
        )
    _refuse_missing(sorted(set(expected) - set(fetched)), named)
    _refuse_unlisted(sorted(set(fetched) - set(expected) - {MANIFEST_NAME}), named)


def _refuse_missing(missing: list[str], named: str = MANIFEST_NAME) -> None:
    if missing:
        raise ChecksumMismatch(
            f"{len(missing)} file(s) listed in {named} are missing: {', '.join(missing[:5])}",
            details={"files": missing},
        )


def _refuse_unlisted(extra: list[str], named: str = MANIFEST_NAME) -> None:
    if extra:
        raise UnsafeRelease(
            f"{len(extra)} file(s) are not listed in {named}: {', '.join(extra[:5])}; "
            "list them or remove them from the release",
            details={"files": extra},
        )
