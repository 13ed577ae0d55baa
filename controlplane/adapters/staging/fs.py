"""The staging area and atomic placement into Triton's model repository.

Invariant: the repository never holds a partly written model dir. A release is written and
verified under ``<staging>/<operation>/model``, fsynced, then placed with one ``renameat2``:
``RENAME_NOREPLACE`` for a new model, ``RENAME_EXCHANGE`` to replace one, after which the old
dir sits where the new one was until the new release serves (:meth:`discard`) or the swap is
undone (:meth:`restore`). Staging lives outside the repository, so Triton's index never lists
a temp dir, and on the same filesystem, or rename would not be atomic. Verified files are also
kept in a content-addressed cache under ``<staging>/cas`` (``cache.py``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import logging
import os
import py_compile
import shutil
import sys
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from controlplane.adapters.instance_lock import LOCK_NAME
from controlplane.adapters.release_tree import changed, fingerprint, regular_files
from controlplane.adapters.staging.cache import CACHE_DIR, ContentCache
from controlplane.domain.checksums import (
    MANIFEST_NAME,
    FileDigest,
    compare_manifest,
    safe_relpath,
)
from controlplane.domain.errors import (
    InvalidModelConfig,
    InvalidName,
    NameConflict,
    StagingFailed,
    UnsafeRelease,
)
from controlplane.domain.names import validate_model_name, validate_slot_name
from controlplane.ports import CachedFiles, Placement, ReleaseListing, ReleaseMarker

log = logging.getLogger(__name__)

MARKER_NAME = ".controlplane-release.json"
ALIAS_MARKER = ".controlplane-alias.json"
_MARKERS = frozenset({MARKER_NAME})
RELEASE_DIR = "model"


class StagingArea:
    def __init__(
        self,
        repository: Path,
        staging: Path,
        *,
        cache_max_bytes: int = 0,
        refuse_python_syntax_errors: bool = True,
    ) -> None:
        self.repository = repository
        self.staging = staging
        self.cache = ContentCache(staging / CACHE_DIR, cache_max_bytes)
        self.refuse_python_syntax_errors = refuse_python_syntax_errors

    # --- start-up checks --------------------------------------------------------------

    def check(self) -> None:
        """Create both dirs and refuse to run where placement could not be atomic."""
        if self.staging.resolve().is_relative_to(self.repository.resolve()):
            raise StagingFailed(
                f"staging dir {self.staging} is inside the repository {self.repository}; Triton "
                "would see temp dirs. Put it beside the repository instead"
            )
        for path in (self.repository, self.staging):
            path.mkdir(parents=True, exist_ok=True)
        repo_dev = self.repository.stat().st_dev
        staging_dev = self.staging.stat().st_dev
        if repo_dev != staging_dev:
            raise StagingFailed(
                f"staging dir {self.staging} and repository {self.repository} are on different "
                "filesystems, so a rename between them is not atomic; put staging.path on the "
                "repository's filesystem (the default is 'staging' beside the repository)"
            )
        if not renameat2_supported(self.staging):
            raise StagingFailed(
                f"the filesystem under {self.staging} does not support renameat2 "
                "RENAME_EXCHANGE (Linux >= 3.15 with ext4, xfs, btrfs, tmpfs, ...)"
            )

    # --- per operation ----------------------------------------------------------------

    def create(self, operation_id: str) -> Path:
        path = self.staging / operation_id
        path.mkdir(parents=False, exist_ok=False)
        return path

    def free_bytes(self) -> int:
        """Bytes an unprivileged writer may still use on the staging filesystem (``f_bavail``:
        the blocks reserved for root are not ours to fill)."""
        try:
            info = os.statvfs(self.staging)
        except OSError as exc:
            raise StagingFailed(f"cannot read the free space under {self.staging}: {exc}") from exc
        return info.f_bavail * info.f_frsize

    def release_dir(self, operation_dir: Path) -> Path:
        return operation_dir / RELEASE_DIR

    def link_cached(
        self,
        dest: Path,
        manifest: Mapping[str, str] | None,
        listing: ReleaseListing,
        *,
        confirm: Callable[[str, str, threading.Event], bool] | None = None,
        cancel: threading.Event | None = None,
    ) -> CachedFiles:
        dest.mkdir(parents=False, exist_ok=False)
        return self.cache.link_into(dest, manifest, listing.files, confirm=confirm, cancel=cancel)

    def remember(
        self, root: Path, files: Mapping[str, FileDigest], listing: ReleaseListing
    ) -> None:
        self.cache.add(root, files, listing.files)

    def verify(
        self,
        root: Path,
        manifest: Mapping[str, str] | None,
        files: Mapping[str, FileDigest],
        *,
        named: str = MANIFEST_NAME,
    ) -> None:
        for rel in files:
            safe_relpath(rel)
        on_disk = [rel for rel, _size in regular_files(root)]
        if set(on_disk) != set(files):
            unexpected = sorted(set(on_disk) ^ set(files))
            raise UnsafeRelease(f"staged files differ from the fetched ones: {unexpected[:5]}")
        if manifest is not None:
            compare_manifest(manifest, files, named)
        if not (root / "config.pbtxt").is_file():
            raise InvalidModelConfig(
                "the release has no config.pbtxt at its top level; Triton needs one"
            )
        if not any(p.is_dir() and p.name.isascii() and p.name.isdigit() for p in root.iterdir()):
            raise InvalidModelConfig(
                "the release has no version dir (such as '1/'); Triton would load nothing"
            )

    def finalize(self, root: Path, marker: ReleaseMarker) -> None:
        _byte_compile(root, refuse=self.refuse_python_syntax_errors)
        (root / MARKER_NAME).write_text(
            json.dumps(
                {
                    "model": marker.model,
                    "release": marker.release,
                    "operation_id": marker.operation_id,
                    "revision": marker.revision,
                    "files": fingerprint(root, skip=_MARKERS),
                }
            ),
            encoding="utf-8",
        )
        _fsync_tree(root)

    def place(self, staged: Path, name: str, *, owner: str) -> Placement:
        target = self.repository / validate_slot_name(name)
        if os.path.lexists(target):
            self._check_owner(name, owner)
            exchange(staged, target)
            replaced: Path | None = staged
        else:
            rename_noreplace(staged, target)
            replaced = None
        _fsync_dir(self.repository)
        _fsync_dir(staged.parent)
        return Placement(model=name, target=target, replaced=replaced)

    def _check_owner(self, name: str, owner: str) -> None:
        """Refuse to replace a dir that was not placed for ``owner``: another model's, or one
        the daemon did not place at all."""
        target = self.repository / name
        marker = self.read_marker(name)
        if marker is not None and marker.model == owner:
            return
        holder = (
            f"model {marker.model!r}'s release {marker.release}"
            if marker is not None
            else "a model dir the daemon did not place"
        )
        raise NameConflict(
            f"{target} holds {holder}, not a release of {owner!r}; nothing was replaced. "
            "Unload that model (or move the dir away) before deploying here",
            details={"dir": name, "holder": marker.model if marker else None},
        )

    def restore(self, placement: Placement) -> None:
        if placement.replaced is not None:
            exchange(placement.replaced, placement.target)
            _fsync_dir(self.repository)
            shutil.rmtree(placement.replaced, ignore_errors=True)
        else:
            self.remove(placement.model)

    def discard(self, placement: Placement) -> None:
        if placement.replaced is not None:
            shutil.rmtree(placement.replaced, ignore_errors=True)

    def remove(self, model: str) -> bool:
        target = self.repository / validate_slot_name(model)
        if not os.path.lexists(target):
            return False
        grave = self.staging / f"removed-{uuid.uuid4().hex}"
        rename_noreplace(target, grave)
        _fsync_dir(self.repository)
        shutil.rmtree(grave, ignore_errors=True)
        return True

    def ensure_alias_dir(self, model: str) -> None:
        target = self.repository / validate_model_name(model)
        if self.is_alias_dir(model):
            return
        if os.path.lexists(target):
            marker = self.read_marker(model)
            raise NameConflict(
                f"{target} holds a model that is not a blue-green alias "
                + (
                    f"(release {marker.release} of {marker.model!r}, deployed inplace); unload "
                    "it before switching the model to blue-green"
                    if marker is not None
                    else "(a dir the daemon did not place); move it away or unload it"
                ),
                details={"dir": model},
            )
        built = self.staging / f"alias-{uuid.uuid4().hex}"
        (built / "1").mkdir(parents=True)
        (built / ALIAS_MARKER).write_text(json.dumps({"alias": model}), encoding="utf-8")
        _fsync_tree(built)
        rename_noreplace(built, target)
        _fsync_dir(self.repository)

    def is_alias_dir(self, model: str) -> bool:
        path = self.repository / validate_slot_name(model) / ALIAS_MARKER
        try:
            return bool(json.loads(path.read_text(encoding="utf-8")).get("alias") == model)
        except (OSError, ValueError, AttributeError):
            return False

    def read_marker(self, name: str) -> ReleaseMarker | None:
        path = self.repository / validate_slot_name(name) / MARKER_NAME
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            revision, files = data.get("revision"), data.get("files")
            return ReleaseMarker(
                model=str(data["model"]),
                release=str(data["release"]),
                operation_id=str(data["operation_id"]),
                revision=None if revision is None else str(revision),
                # a marker of an older daemon has no digest: nothing to compare
                edited=changed(path.parent, files),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def placed(self) -> dict[str, ReleaseMarker]:
        found: dict[str, ReleaseMarker] = {}
        for entry in sorted(self.repository.iterdir()):
            if not entry.is_dir() or entry.is_symlink():
                continue
            try:
                marker = self.read_marker(entry.name)
            except InvalidName:
                continue  # not a name the daemon gives: someone else's
            if marker is not None:
                found[entry.name] = marker
        return found

    def cleanup(self, operation_id: str) -> None:
        shutil.rmtree(self.staging / operation_id, ignore_errors=True)

    def clean_all(self) -> list[str]:
        removed: list[str] = []
        if not self.staging.is_dir():
            return removed
        for entry in sorted(self.staging.iterdir()):
            if entry.name == CACHE_DIR:
                continue  # the content cache outlives restarts; evict() bounds it
            if entry.name == LOCK_NAME:
                continue  # held by this daemon: removing it would let a second one in
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry.name)
        return removed


def _byte_compile(root: Path, *, refuse: bool) -> None:
    """Compile Python-backend sources now, so Python never writes ``__pycache__`` after the
    load: Triton would see a newer mtime and treat the model as modified.

    A source that does not compile is refused (``refuse``) before anything is placed: Triton
    would only fail the load, after the release took a slot. It is compiled with the daemon's
    Python, which may be older than the one Triton's Python backend runs; without ``refuse``
    (``staging.refuse_python_syntax_errors: false``) it is only logged.
    """
    for source in sorted(root.rglob("*.py")):
        try:
            py_compile.compile(str(source), doraise=True)
        except py_compile.PyCompileError as exc:
            problem = _compile_problem(source.relative_to(root).as_posix(), exc)
            if not refuse:
                log.warning("could not byte-compile %s", problem)
                continue
            python = f"{sys.version_info.major}.{sys.version_info.minor}"
            raise UnsafeRelease(
                f"{problem}. Triton's Python backend could not load it: fix the source and "
                f"publish a new release (compiled with Python {python}; if Triton runs a newer "
                "Python that accepts it, set staging.refuse_python_syntax_errors: false)",
                details={"file": source.relative_to(root).as_posix()},
            ) from exc


def _compile_problem(rel: str, exc: py_compile.PyCompileError) -> str:
    """``<file> line <n>: <the compiler's message>`` (the line when the compiler gives one)."""
    error = exc.exc_value
    if isinstance(error, SyntaxError):  # IndentationError and TabError included
        line = f" line {error.lineno}" if error.lineno else ""
        return f"{rel}{line}: {error.msg}"
    return f"{rel}: {error}"  # not text Python can read (a null byte, bad encoding)


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(Path(dirpath) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- renameat2(2): the atomic exchange ---------------------------------------------------------


AT_FDCWD = -100
RENAME_NOREPLACE = 1 << 0
RENAME_EXCHANGE = 1 << 1

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_renameat2 = _libc.renameat2
_renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
_renameat2.restype = ctypes.c_int


def _call(source: Path, target: Path, flags: int) -> None:
    result = _renameat2(AT_FDCWD, os.fsencode(source), AT_FDCWD, os.fsencode(target), flags)
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"renameat2: {os.strerror(code)}", str(source), None, str(target))


def exchange(a: Path, b: Path) -> None:
    """Atomically swap two existing paths."""
    _call(a, b, RENAME_EXCHANGE)


def rename_noreplace(source: Path, target: Path) -> None:
    """Rename, failing with EEXIST instead of replacing an existing ``target``."""
    _call(source, target, RENAME_NOREPLACE)


def renameat2_supported(probe_dir: Path) -> bool:
    """Whether this kernel and filesystem support ``RENAME_EXCHANGE`` under ``probe_dir``."""
    tag = uuid.uuid4().hex  # unique: a probe left by a killed start-up never gets in the way
    a = probe_dir / f".renameat2-probe-{tag}-a"
    b = probe_dir / f".renameat2-probe-{tag}-b"
    try:
        a.mkdir()
        b.mkdir()
        exchange(a, b)
        return True
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            return False
        raise
    finally:
        for path in (a, b):
            if path.is_dir():
                path.rmdir()
