"""The local-directory model store: ``<root>/<model>/<release>/`` on a filesystem.

Fetching copies the release file by file into the staging dir, hashing while writing and
holding at most one chunk in memory. Symlinks and special files are refused rather than
followed: a release is plain files and dirs, nothing that could point outside it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from controlplane.adapters.release_tree import regular_files
from controlplane.domain.checksums import MANIFEST_NAME, FileDigest, parse_manifest
from controlplane.domain.errors import ModelNotFound, ReleaseNotFound, UnsafeRelease
from controlplane.domain.names import validate_model_name, validate_release_name
from controlplane.domain.releases import ReleaseInfo, natural_key
from controlplane.ports import FetchedRelease, FetchProgress

CHUNK = 1024 * 1024


class LocalStore:
    def __init__(self, root: Path) -> None:
        self._root = root

    @property
    def uri(self) -> str:
        return self._root.as_uri()

    def close(self) -> None:
        return None

    def list_models(self) -> list[str]:
        if not self._root.is_dir():
            return []
        names = []
        for entry in self._root.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                try:
                    names.append(validate_model_name(entry.name))
                except Exception:  # noqa: S112 - a stray dir in the store is not a model
                    continue
        return sorted(names, key=natural_key)

    def list_releases(self, model: str) -> list[ReleaseInfo]:
        model_dir = self._model_dir(model)
        if not model_dir.is_dir():
            raise ModelNotFound(f"model {model!r} is not in the store {self.uri}")
        releases = []
        for entry in model_dir.iterdir():
            if not entry.is_dir() or entry.is_symlink():
                continue
            try:
                name = validate_release_name(entry.name)
            except Exception:  # noqa: S112 - not a release dir
                continue
            releases.append(_info(model, name, entry))
        return sorted(releases, key=lambda r: natural_key(r.name))

    def describe(self, model: str, release: str) -> ReleaseInfo:
        path = self._release_dir(model, release)
        if not path.is_dir() or path.is_symlink():
            raise ReleaseNotFound(
                f"release {release!r} of model {model!r} is not in the store {self.uri}"
            )
        return _info(model, release, path)

    def read_manifest(self, model: str, release: str) -> dict[str, str] | None:
        path = self._release_dir(model, release) / MANIFEST_NAME
        if path.is_symlink():
            raise UnsafeRelease(f"{MANIFEST_NAME} of {model}/{release} is a symlink")
        try:
            return parse_manifest(path.read_text(encoding="utf-8"))
        except (FileNotFoundError, IsADirectoryError):
            return None

    def fetch(
        self,
        model: str,
        release: str,
        dest: Path,
        *,
        have: Mapping[str, FileDigest] | None = None,
        progress: Callable[[FetchProgress], None] | None = None,
    ) -> FetchedRelease:
        source = self._release_dir(model, release)
        if source.is_symlink() or source.parent.is_symlink():
            raise UnsafeRelease(
                f"release {release!r} of model {model!r} is a symlink in the store; "
                "publish plain directories"
            )
        if not source.is_dir():
            raise ReleaseNotFound(f"release {release!r} of model {model!r} is gone from the store")
        plan = regular_files(source)
        total = sum(size for _, size in plan)
        files: dict[str, FileDigest] = {rel: have[rel] for rel, _ in plan if have and rel in have}
        done_bytes = sum(digest.size for digest in files.values())
        fetched_bytes = 0
        for rel, _size in plan:
            if rel in files:
                continue
            digest = _copy_hashing(source / rel, dest / rel)
            files[rel] = digest
            done_bytes += digest.size
            fetched_bytes += digest.size
            if progress is not None:
                progress(FetchProgress(len(files), len(plan), done_bytes, total))
        manifest_path = dest / MANIFEST_NAME
        manifest = (
            parse_manifest(manifest_path.read_text(encoding="utf-8"))
            if manifest_path.is_file()
            else None
        )
        return FetchedRelease(
            manifest=manifest, files=files, bytes_total=total, bytes_fetched=fetched_bytes
        )

    def _model_dir(self, model: str) -> Path:
        return self._root / validate_model_name(model)

    def _release_dir(self, model: str, release: str) -> Path:
        return self._model_dir(model) / validate_release_name(release)


def _info(model: str, release: str, path: Path) -> ReleaseInfo:
    try:
        marker = (path / MANIFEST_NAME).lstat()
    except FileNotFoundError:
        return ReleaseInfo(model, release, complete=False)
    if not stat.S_ISREG(marker.st_mode):
        return ReleaseInfo(model, release, complete=False)
    # The marker's content is the revision: a republished release lists other digests.
    digest = hashlib.sha256((path / MANIFEST_NAME).read_bytes()).hexdigest()
    return ReleaseInfo(model, release, True, revision=digest)


def _copy_hashing(source: Path, target: Path) -> FileDigest:
    target.parent.mkdir(parents=True, exist_ok=True)
    sha = hashlib.sha256()
    size = 0
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(source, flags)
    with os.fdopen(fd, "rb") as reader, open(target, "xb") as writer:
        while chunk := reader.read(CHUNK):
            sha.update(chunk)
            writer.write(chunk)
            size += len(chunk)
    return FileDigest(size=size, sha256=sha.hexdigest())
