"""Staging and atomic placement on real tmp dirs: renameat2, verification, markers, clean-up."""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import logging
import os
from pathlib import Path

import pytest

from controlplane.adapters.instance_lock import LOCK_NAME
from controlplane.adapters.staging.fs import (
    MARKER_NAME,
    StagingArea,
    exchange,
    rename_noreplace,
    renameat2_supported,
)
from controlplane.domain.checksums import MANIFEST_NAME, FileDigest
from controlplane.domain.errors import (
    ChecksumMismatch,
    InvalidModelConfig,
    InvalidName,
    NameConflict,
    StagingFailed,
    UnsafeRelease,
)
from controlplane.ports import Placement, ReleaseMarker

Tree = tuple[frozenset[str], dict[str, bytes]]

OLD = {
    "config.pbtxt": b'name: "m"\nbackend: "python"\n',
    "1/model.py": b"OLD = 1\n",
    MARKER_NAME: b'{"model": "m", "release": "r1", "operation_id": "op-0"}',
}
NEW = {
    "config.pbtxt": b'name: "m"\nbackend: "python"\nmax_batch_size: 4\n',
    "1/model.py": b"NEW = 2\n",
    "2/weights.bin": b"\x00\x01" * 500,
}


def tree(root: Path) -> Tree:
    """Every dir and every file's bytes under ``root``: what a user would see with ls -R."""
    dirs = frozenset(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_dir())
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    return dirs, files


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def digests(files: dict[str, bytes]) -> dict[str, FileDigest]:
    return {r: FileDigest(len(d), hashlib.sha256(d).hexdigest()) for r, d in files.items()}


def manifest_of(files: dict[str, bytes]) -> dict[str, str]:
    return {r: hashlib.sha256(d).hexdigest() for r, d in files.items()}


@pytest.fixture
def area(tmp_path: Path) -> StagingArea:
    staging = StagingArea(tmp_path / "repository", tmp_path / "staging")
    staging.check()
    return staging


def staged(area: StagingArea, operation_id: str, files: dict[str, bytes]) -> Path:
    return write_tree(area.release_dir(area.create(operation_id)), files)


# --- check --------------------------------------------------------------------------------


def test_check_creates_both_dirs_and_passes(tmp_path: Path) -> None:
    area = StagingArea(tmp_path / "root" / "repository", tmp_path / "root" / "staging")
    area.check()
    assert (tmp_path / "root" / "repository").is_dir()
    assert (tmp_path / "root" / "staging").is_dir()
    assert list((tmp_path / "root" / "staging").iterdir()) == []  # the probe cleaned up
    area.check()  # idempotent


def test_check_refuses_staging_inside_the_repository(tmp_path: Path) -> None:
    area = StagingArea(tmp_path / "repository", tmp_path / "repository" / "staging")
    with pytest.raises(StagingFailed) as caught:
        area.check()
    assert caught.value.code == "staging_failed"
    assert "inside the repository" in caught.value.message


def test_check_refuses_staging_equal_to_the_repository(tmp_path: Path) -> None:
    with pytest.raises(StagingFailed, match="inside the repository"):
        StagingArea(tmp_path / "repository", tmp_path / "repository").check()


def test_check_refuses_staging_on_another_filesystem(
    tmp_path: Path, other_filesystem: Path
) -> None:
    area = StagingArea(tmp_path / "repository", other_filesystem)
    with pytest.raises(StagingFailed) as caught:
        area.check()
    assert caught.value.code == "staging_failed"
    assert "different filesystems" in caught.value.message


def test_check_survives_a_probe_dir_left_by_a_killed_start(tmp_path: Path) -> None:
    (tmp_path / "staging" / ".renameat2-probe-a").mkdir(parents=True)
    StagingArea(tmp_path / "repository", tmp_path / "staging").check()


# --- create / place / restore / discard / remove ------------------------------------------


def test_create_gives_a_fresh_dir_per_operation(area: StagingArea) -> None:
    op_dir = area.create("op-1")
    assert op_dir == area.staging / "op-1"
    assert op_dir.is_dir()
    assert area.release_dir(op_dir) == op_dir / "model"
    with pytest.raises(FileExistsError):
        area.create("op-1")
    area.cleanup("op-1")
    assert not op_dir.exists()


def test_place_into_an_empty_repository(area: StagingArea) -> None:
    source = staged(area, "op-1", NEW)

    placement = area.place(source, "m", owner="m")

    target = area.repository / "m"
    assert placement == Placement(model="m", target=target, replaced=None)
    assert tree(target)[1] == NEW
    assert not source.exists()


def test_place_over_an_existing_dir_exchanges_them(area: StagingArea) -> None:
    write_tree(area.repository / "m", OLD)
    old_tree = tree(area.repository / "m")
    source = staged(area, "op-1", NEW)
    new_tree = tree(source)

    placement = area.place(source, "m", owner="m")

    assert placement == Placement(model="m", target=area.repository / "m", replaced=source)
    assert tree(area.repository / "m") == new_tree
    assert tree(source) == old_tree


def test_place_refuses_an_invalid_model_name(area: StagingArea) -> None:
    source = staged(area, "op-1", NEW)
    with pytest.raises(InvalidName):
        area.place(source, "../escape", owner="m")
    assert tree(source)[1] == NEW
    assert list(area.repository.iterdir()) == []


@pytest.mark.parametrize(
    ("holder", "says"),
    [
        (b'{"model": "m__green", "release": "r7", "operation_id": "op-9"}', "'m__green'"),
        (None, "did not place"),
    ],
    ids=["another-model", "not-placed-by-the-daemon"],
)
def test_place_refuses_a_dir_that_belongs_to_someone_else(
    area: StagingArea, holder: bytes | None, says: str
) -> None:
    theirs = {k: v for k, v in OLD.items() if k != MARKER_NAME}
    if holder is not None:
        theirs[MARKER_NAME] = holder
    write_tree(area.repository / "m", theirs)
    before = tree(area.repository)
    source = staged(area, "op-1", NEW)

    with pytest.raises(NameConflict) as caught:
        area.place(source, "m", owner="m")

    assert caught.value.code == "name_conflict"
    assert says in caught.value.message
    assert tree(area.repository) == before  # nothing moved
    assert tree(source)[1] == NEW


def test_placed_lists_the_dirs_with_a_marker(area: StagingArea) -> None:
    write_tree(area.repository / "m", OLD)
    write_tree(area.repository / "foreign", {"config.pbtxt": b"x"})
    (area.repository / "not..a-slot-name").mkdir()
    assert area.placed() == {"m": ReleaseMarker(model="m", release="r1", operation_id="op-0")}


def test_restore_after_an_exchange_puts_the_old_content_back_exactly(area: StagingArea) -> None:
    write_tree(area.repository / "m", {**OLD, "1/sub/deep.txt": b"deep", "empty-dir/.keep": b""})
    (area.repository / "m" / "only-a-dir").mkdir()
    before = tree(area.repository)
    placement = area.place(staged(area, "op-1", NEW), "m", owner="m")
    assert tree(area.repository) != before

    area.restore(placement)

    assert tree(area.repository) == before
    assert placement.replaced is not None
    assert not placement.replaced.exists()


def test_restore_after_a_fresh_placement_removes_the_dir(area: StagingArea) -> None:
    write_tree(area.repository / "other", OLD)
    before = tree(area.repository)
    placement = area.place(staged(area, "op-1", NEW), "m", owner="m")

    area.restore(placement)

    assert not (area.repository / "m").exists()
    assert tree(area.repository) == before
    assert [p.name for p in area.staging.iterdir()] == ["op-1"]


def test_discard_deletes_the_replaced_dir(area: StagingArea) -> None:
    write_tree(area.repository / "m", OLD)
    placement = area.place(staged(area, "op-1", NEW), "m", owner="m")
    assert placement.replaced is not None

    area.discard(placement)

    assert not placement.replaced.exists()
    assert tree(area.repository / "m")[1] == NEW


def test_discard_after_a_fresh_placement_keeps_the_model(area: StagingArea) -> None:
    placement = area.place(staged(area, "op-1", NEW), "m", owner="m")
    area.discard(placement)
    assert tree(area.repository / "m")[1] == NEW


def test_remove_takes_a_model_dir_out(area: StagingArea) -> None:
    write_tree(area.repository / "m", OLD)
    write_tree(area.repository / "keep", OLD)

    assert area.remove("m") is True

    assert sorted(p.name for p in area.repository.iterdir()) == ["keep"]
    assert list(area.staging.iterdir()) == []  # the grave was deleted too
    assert area.remove("m") is False


def test_remove_refuses_an_invalid_name(area: StagingArea) -> None:
    write_tree(area.repository / "m", OLD)
    with pytest.raises(InvalidName):
        area.remove("..")
    assert (area.repository / "m").is_dir()


# --- finalize and markers -----------------------------------------------------------------


def test_finalize_writes_a_marker_that_read_marker_returns(area: StagingArea) -> None:
    source = staged(area, "op-1", NEW)
    marker = ReleaseMarker(model="m", release="r2", operation_id="op-1")

    area.finalize(source, marker)
    area.place(source, "m", owner="m")

    assert (area.repository / "m" / MARKER_NAME).is_file()
    assert area.read_marker("m") == marker


def test_a_placed_dir_edited_by_hand_is_marked_edited_and_what_the_model_writes_is_not(
    area: StagingArea,
) -> None:
    """Found from outside: a model.py edited in a placed slot was served, and reported, as
    the release placed there; and then, that a model writing an engine cache into its own dir
    at load was placed again at every pass."""
    source = staged(area, "op-1", NEW)
    area.finalize(source, ReleaseMarker(model="m", release="r2", operation_id="op-1"))
    area.place(source, "m", owner="m")
    placed = area.repository / "m"
    (placed / "1" / "__pycache__" / "model.cpython-399.pyc").write_bytes(b"Triton's own")
    (placed / "1" / "engine.cache").write_bytes(b"written by the model at its load")
    assert area.read_marker("m") == ReleaseMarker("m", "r2", "op-1")  # not edited

    model_py = placed / "1" / "model.py"
    model_py.write_bytes(model_py.read_bytes().replace(b"2", b"9"))  # same size, in place

    marker = area.read_marker("m")
    assert marker is not None
    assert marker.edited
    assert area.placed()["m"].edited
    (placed / "1" / "model.py").unlink()
    (placed / "extra.txt").write_bytes(b"x")
    assert area.read_marker("m") == ReleaseMarker("m", "r2", "op-1", edited=True)


def test_an_empty_dir_added_to_a_placed_dir_is_an_edit(area: StagingArea) -> None:
    """Found from outside: an empty version dir added by hand went unseen, and Triton then
    loaded that version (with no model.py) at the next repair."""
    source = staged(area, "op-1", NEW)
    area.finalize(source, ReleaseMarker(model="m", release="r2", operation_id="op-1"))
    area.place(source, "m", owner="m")

    (area.repository / "m" / "3").mkdir()

    assert area.read_marker("m") == ReleaseMarker("m", "r2", "op-1", edited=True)


def test_finalize_byte_compiles_python_sources(area: StagingArea) -> None:
    source = staged(area, "op-1", NEW)

    area.finalize(source, ReleaseMarker("m", "r2", "op-1"))

    compiled = Path(importlib.util.cache_from_source(str(source / "1" / "model.py")))
    assert compiled.parent == source / "1" / "__pycache__"
    assert compiled.is_file()
    assert compiled.stat().st_mtime_ns >= (source / "1" / "model.py").stat().st_mtime_ns


def test_finalize_refuses_a_python_source_that_does_not_compile(area: StagingArea) -> None:
    source = staged(area, "op-1", {**NEW, "1/model.py": b"import numpy\n\ndef broken(:\n"})

    with pytest.raises(UnsafeRelease) as raised:
        area.finalize(source, ReleaseMarker("m", "r2", "op-1"))

    assert raised.value.code == "invalid_release"
    assert raised.value.message.startswith("1/model.py line 3: ")
    assert "staging.refuse_python_syntax_errors" in raised.value.message
    assert raised.value.details == {"file": "1/model.py"}
    assert not (source / MARKER_NAME).exists()


def test_finalize_refuses_a_python_source_that_is_not_text(area: StagingArea) -> None:
    source = staged(area, "op-1", {**NEW, "1/util.py": b"X = 1\n\x00\n"})

    with pytest.raises(UnsafeRelease) as raised:
        area.finalize(source, ReleaseMarker("m", "r2", "op-1"))

    assert raised.value.message.startswith("1/util.py")  # a line too from Python 3.12 on
    assert "null bytes" in raised.value.message


def test_finalize_only_logs_a_syntax_error_when_told_not_to_refuse(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # For a Triton whose Python backend runs a newer Python than the daemon's.
    area = StagingArea(
        tmp_path / "repository", tmp_path / "staging", refuse_python_syntax_errors=False
    )
    area.check()
    source = staged(area, "op-1", {**NEW, "1/model.py": b"def broken(:\n"})

    with caplog.at_level(logging.WARNING):
        area.finalize(source, ReleaseMarker("m", "r2", "op-1"))

    assert "could not byte-compile 1/model.py line 1: " in caplog.text
    assert (source / MARKER_NAME).is_file()


def test_read_marker_of_a_model_without_one(area: StagingArea) -> None:
    assert area.read_marker("m") is None
    write_tree(area.repository / "m", {k: v for k, v in OLD.items() if k != MARKER_NAME})
    assert area.read_marker("m") is None
    (area.repository / "m" / MARKER_NAME).write_text("{not json", encoding="utf-8")
    assert area.read_marker("m") is None
    (area.repository / "m" / MARKER_NAME).write_text('{"model": "m"}', encoding="utf-8")
    assert area.read_marker("m") is None


# --- verify -------------------------------------------------------------------------------


def with_manifest(files: dict[str, bytes]) -> dict[str, bytes]:
    text = "".join(f"{hashlib.sha256(d).hexdigest()}  {r}\n" for r, d in sorted(files.items()))
    return {**files, MANIFEST_NAME: text.encode()}


def test_verify_accepts_a_matching_release(area: StagingArea) -> None:
    files = with_manifest(NEW)
    root = staged(area, "op-1", files)
    area.verify(root, manifest_of(NEW), digests(files))
    area.verify(root, None, digests(files))


def test_verify_refuses_a_symlink(area: StagingArea, tmp_path: Path) -> None:
    root = staged(area, "op-1", NEW)
    (tmp_path / "outside").write_bytes(b"x")
    (root / "1" / "link.py").symlink_to(tmp_path / "outside")
    with pytest.raises(UnsafeRelease, match=r"symlink at '1/link\.py'"):
        area.verify(root, manifest_of(NEW), digests(NEW))


def test_verify_refuses_a_file_that_was_not_fetched(area: StagingArea) -> None:
    root = staged(area, "op-1", {**NEW, "1/smuggled.so": b"\x7fELF"})
    with pytest.raises(UnsafeRelease, match=r"1/smuggled\.so") as caught:
        area.verify(root, manifest_of(NEW), digests(NEW))
    assert caught.value.code == "invalid_release"


def test_verify_refuses_a_fetched_file_that_vanished(area: StagingArea) -> None:
    root = staged(area, "op-1", NEW)
    (root / "2" / "weights.bin").unlink()
    with pytest.raises(UnsafeRelease, match=r"2/weights\.bin"):
        area.verify(root, manifest_of(NEW), digests(NEW))


def test_verify_refuses_an_unsafe_fetched_path(area: StagingArea) -> None:
    root = staged(area, "op-1", NEW)
    with pytest.raises(UnsafeRelease, match="not allowed"):
        area.verify(root, None, {**digests(NEW), "../escape": FileDigest(1, "0" * 64)})


def test_verify_checks_the_manifest(area: StagingArea) -> None:
    root = staged(area, "op-1", NEW)
    manifest = {**manifest_of(NEW), "1/model.py": hashlib.sha256(b"other").hexdigest()}
    with pytest.raises(ChecksumMismatch, match=r"1/model\.py") as caught:
        area.verify(root, manifest, digests(NEW))
    assert caught.value.code == "checksum_mismatch"


def test_verify_refuses_a_release_without_config(area: StagingArea) -> None:
    files = {r: d for r, d in NEW.items() if r != "config.pbtxt"}
    root = staged(area, "op-1", files)
    with pytest.raises(InvalidModelConfig, match=r"no config\.pbtxt") as caught:
        area.verify(root, manifest_of(files), digests(files))
    assert caught.value.code == "invalid_model_config"


def test_verify_refuses_a_release_without_a_version_dir(area: StagingArea) -> None:
    files = {"config.pbtxt": NEW["config.pbtxt"], "v1/model.py": b"", "model.py": b""}
    root = staged(area, "op-1", files)
    with pytest.raises(InvalidModelConfig, match="no version dir"):
        area.verify(root, manifest_of(files), digests(files))


def test_a_numeric_file_is_not_a_version_dir(area: StagingArea) -> None:
    files = {"config.pbtxt": NEW["config.pbtxt"], "1": b"a file, not a dir"}
    root = staged(area, "op-1", files)
    with pytest.raises(InvalidModelConfig, match="no version dir"):
        area.verify(root, manifest_of(files), digests(files))


# --- clean_all ----------------------------------------------------------------------------


def test_clean_all_removes_leftovers_and_names_them(area: StagingArea) -> None:
    staged(area, "op-2", NEW)
    staged(area, "op-1", OLD)
    (area.staging / "stray-file").write_bytes(b"x")
    (area.staging / "dangling").symlink_to(area.staging / "nowhere")
    write_tree(area.repository / "m", OLD)

    removed = area.clean_all()

    assert removed == ["dangling", "op-1", "op-2", "stray-file"]
    assert list(area.staging.iterdir()) == []
    assert tree(area.repository / "m")[1] == OLD
    assert area.clean_all() == []


def test_clean_all_keeps_the_daemons_lock_file(area: StagingArea) -> None:
    lock_file = area.staging / LOCK_NAME
    lock_file.write_text("{}", encoding="utf-8")
    staged(area, "op-1", OLD)

    assert area.clean_all() == ["op-1"]
    assert lock_file.is_file()  # deleting it would let a second daemon lock a new file


def test_clean_all_without_a_staging_dir(tmp_path: Path) -> None:
    assert StagingArea(tmp_path / "repository", tmp_path / "staging").clean_all() == []


# --- renameat -----------------------------------------------------------------------------


def test_renameat_is_supported_here(tmp_path: Path) -> None:
    assert renameat2_supported(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_exchange_swaps_two_dirs(tmp_path: Path) -> None:
    a = write_tree(tmp_path / "a", OLD)
    b = write_tree(tmp_path / "b", NEW)
    tree_a, tree_b = tree(a), tree(b)

    exchange(a, b)

    assert tree(a) == tree_b
    assert tree(b) == tree_a


def test_exchange_needs_both_paths(tmp_path: Path) -> None:
    a = write_tree(tmp_path / "a", OLD)
    with pytest.raises(FileNotFoundError):
        exchange(a, tmp_path / "missing")
    assert tree(a)[1] == OLD


def test_rename_noreplace_moves_into_a_free_name(tmp_path: Path) -> None:
    a = write_tree(tmp_path / "a", OLD)
    rename_noreplace(a, tmp_path / "b")
    assert not a.exists()
    assert tree(tmp_path / "b")[1] == OLD


@pytest.mark.parametrize("target_is_dir", [True, False], ids=["dir", "file"])
def test_rename_noreplace_refuses_an_existing_target(tmp_path: Path, target_is_dir: bool) -> None:
    a = write_tree(tmp_path / "a", OLD)
    b = tmp_path / "b"
    if target_is_dir:
        write_tree(b, NEW)
    else:
        b.write_bytes(b"in the way")
    before = tree(tmp_path)

    with pytest.raises(FileExistsError) as caught:
        rename_noreplace(a, b)

    assert caught.value.errno == errno.EEXIST
    assert caught.value.filename == str(a)
    assert caught.value.filename2 == str(b)
    assert tree(tmp_path) == before


def test_free_bytes_is_what_an_unprivileged_writer_may_still_use(area: StagingArea) -> None:
    info = os.statvfs(area.staging)

    free = area.free_bytes()

    # f_bavail, not f_bfree: the blocks kept for root are not ours to fill. Others write on
    # this filesystem too, so the two readings agree only roughly.
    assert free == pytest.approx(info.f_bavail * info.f_frsize, abs=1024**3)
    assert free > 0
