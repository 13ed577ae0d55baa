"""`make run STORE=...`: which store the development daemon serves from.

Owns turning what a user typed (nothing, a directory, ``file:///...`` or ``s3://bucket/prefix``)
into the daemon's ``store.uri``, and refusing a value it could not use in one line that names
the value and says what to give instead. It runs before Triton starts, so a typo costs no
Triton start-up; the daemon checks the URI's form again itself. Nothing here reaches S3: the
bucket is read with the usual AWS credential chain once the daemon runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

# S3's rules for a bucket name: 3 to 63 lowercase letters, digits, dots and hyphens, starting
# and ending with a letter or digit.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_WHAT_TO_GIVE = "give a directory holding MODEL/RELEASE/ dirs, or s3://bucket/prefix"


class StoreChoiceError(ValueError):
    """A STORE value the daemon could not serve from; its message is the whole explanation."""


def store_uri(value: str | None, default: Path) -> str:
    """The store URI for `value`, or `default` (a directory) when none is given."""
    if value is None or not value.strip():
        return _file_uri(default)
    parsed = urlparse(value)
    if parsed.scheme == "s3":
        return _s3_uri(value, parsed.netloc)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise StoreChoiceError(f"STORE={value}: a file URI names a local path: {_WHAT_TO_GIVE}")
        return _directory_uri(value, Path(parsed.path))
    if "://" in value:
        raise StoreChoiceError(f"STORE={value}: not a store the daemon reads: {_WHAT_TO_GIVE}")
    return _directory_uri(value, Path(value).expanduser())


def _s3_uri(value: str, bucket: str) -> str:
    if "@" in bucket or ":" in bucket:
        # Never echoed: what precedes the bucket would be a key and its secret.
        raise StoreChoiceError(
            "STORE: an S3 URI names the bucket only (s3://bucket/prefix); credentials come "
            "from the AWS chain (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
        )
    if not _BUCKET.fullmatch(bucket):
        raise StoreChoiceError(
            f"STORE={value}: {bucket!r} is not an S3 bucket name (3 to 63 lowercase letters, "
            "digits, dots or hyphens): give s3://bucket/prefix"
        )
    return value.rstrip("/")


def _directory_uri(value: str, path: Path) -> str:
    if not path.exists():
        raise StoreChoiceError(f"STORE={value}: no such directory: {_WHAT_TO_GIVE}")
    if not path.is_dir():
        raise StoreChoiceError(f"STORE={value}: not a directory: {_WHAT_TO_GIVE}")
    return _file_uri(path.resolve())


def _file_uri(path: Path) -> str:
    # Not Path.as_uri(): the daemon reads store.uri's path as it stands, with no %-decoding, so
    # a space in a directory's name must stay a space.
    return f"file://{path}"
