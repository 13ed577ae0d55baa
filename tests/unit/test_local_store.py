"""The local-directory store: listing, describing and fetching releases from a tmp dir.

Fetches go the way the prepare step drives them: the manifest, then the listing, then a fetch
of that listing with the manifest's digests.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from controlplane.adapters.stores.local import LocalStore
from controlplane.domain.checksums import MANIFEST_NAME, FileDigest
from controlplane.domain.errors import (
    Interrupted,
    InvalidName,
    ModelNotFound,
    ReleaseChanged,
    ReleaseNotFound,
    StoreUnavailable,
    UnsafeRelease,
)
from controlplane.domain.ignored import IgnoredName
from controlplane.domain.releases import ReleaseInfo
from controlplane.domain.transfer import RetryCause
from controlplane.ports import FetchedRelease, FetchProgress
from controlplane.services.telemetry import NoTelemetry
from tests.support.manifests import manifest_of

CONFIG = b'name: "m"\nbackend: "python"\n'
MODEL_PY = b"class TritonPythonModel:\n    pass\n"


def write_release(
    store: Path, model: str, release: str, files: dict[str, bytes], *, manifest: bool = True
) -> Path:
    root = store / model / release
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    root.mkdir(parents=True, exist_ok=True)
    if manifest:
        lines = [f"{hashlib.sha256(d).hexdigest()}  {rel}\n" for rel, d in sorted(files.items())]
        (root / MANIFEST_NAME).write_text("".join(lines), encoding="utf-8")
    return root


def release_files(extra: bytes = b"") -> dict[str, bytes]:
    return {
        "config.pbtxt": CONFIG,
        "1/model.py": MODEL_PY + extra,
        "1/data/weights.bin": os.urandom(3 * 1024 * 1024 + 17),  # more than one copy chunk
        "1/empty": b"",
    }


def fetch(store: LocalStore, model: str, release: str, dest: Path, **kwargs: Any) -> FetchedRelease:
    """Read the manifest, list the release, fetch the listing: what the prepare step does."""
    manifest = manifest_of(store, model, release)
    return store.fetch(store.list_files(model, release), dest, manifest=manifest, **kwargs)


class CountedRetries(NoTelemetry):
    """Telemetry that keeps the store's retry reports."""

    def __init__(self) -> None:
        self.retries: list[RetryCause] = []

    def store_retried(self, cause: RetryCause) -> None:
        self.retries.append(cause)


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    root.mkdir()
    return root


def test_an_absent_root_is_said_to_be_absent_not_empty(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "nowhere")
    says = (
        f"the store {(tmp_path / 'nowhere').as_uri()} does not exist (store.uri): create it or "
        "fix the setting"
    )
    for call in (
        store.list_models,
        lambda: store.list_releases("m"),
        lambda: store.describe("m", "r1"),
    ):
        with pytest.raises(StoreUnavailable) as caught:
            call()
        assert says in caught.value.message


def test_uri_is_a_file_uri(store_root: Path) -> None:
    assert LocalStore(store_root).uri == store_root.as_uri()


def test_list_models_skips_files_symlinks_and_invalid_names(store_root: Path) -> None:
    for name in ("resnet", "bert10", "bert2", ".hidden", "with space"):
        (store_root / name).mkdir()
    (store_root / "README").write_text("not a model", encoding="utf-8")
    (store_root / "alias").symlink_to(store_root / "resnet")

    assert LocalStore(store_root).list_models() == ["bert2", "bert10", "resnet"]


def test_list_models_reports_the_dirs_it_ignores_for_their_names(store_root: Path) -> None:
    for name in ("resnet", "with space", "evil<b>x", "a__b", ".hidden", "_controlplane"):
        (store_root / name).mkdir()
    (store_root / "lost+found").mkdir()
    os.mkdir(os.fsencode(store_root) + b"/bad\xffbyte")  # not UTF-8
    (store_root / "Bad Name.txt").write_text("a file is no model dir", encoding="utf-8")
    ignored: list[IgnoredName] = []

    assert LocalStore(store_root).list_models(ignored=ignored.append) == ["resnet"]

    found = {entry.name: entry for entry in ignored}
    assert sorted(found) == ["a__b", "bad\\xffbyte", "evil<b>x", "with space"]
    assert found["with space"].where == f"{store_root}/with space"
    assert "use letters, digits, '.', '_' and '-'" in found["evil<b>x"].reason
    assert "reserved for the daemon's blue-green slots" in found["a__b"].reason
    assert found["bad\\xffbyte"].where == f"{store_root}/bad\\xffbyte"  # printable
    # Every name can be answered in JSON (a local name's lone surrogates could not be encoded).
    json.dumps([vars_of(entry) for entry in ignored], ensure_ascii=False).encode()


def test_list_releases_reports_the_dirs_it_ignores_for_their_names(store_root: Path) -> None:
    write_release(store_root, "m", "r1", {"config.pbtxt": CONFIG})
    for name in ("r 5", '"quote', "<img src=x onerror=alert(7)>", "x" * 129, "tab\there"):
        write_release(store_root, "m", name, {"config.pbtxt": CONFIG})
    (store_root / "m" / ".partial").mkdir()
    (store_root / "m" / "notes .txt").write_text("a file is no release dir", encoding="utf-8")
    ignored: list[IgnoredName] = []

    releases = LocalStore(store_root).list_releases("m", ignored=ignored.append)

    assert [r.name for r in releases] == ["r1"]
    found = {entry.name: entry for entry in ignored}
    assert sorted(found) == sorted(
        ['"quote', "<img src=x onerror=alert(7)>", "r 5", "tab\\there", "x" * 129]
    )
    assert found["r 5"].reason == (
        "release name 'r 5' is not allowed: use letters, digits, '.', '_' and '-', start with "
        "a letter or digit, and do not use '..'"
    )
    assert found["x" * 129].reason == "release name is 129 characters long; the limit is 128"
    assert found["r 5"].where == f"{store_root}/m/r 5"


def vars_of(entry: IgnoredName) -> dict[str, str]:
    return {"name": entry.name, "reason": entry.reason, "where": entry.where}


def test_a_symlinked_model_dir_has_no_releases_either(store_root: Path) -> None:
    """An event names a model by its dir's name; listed alone it must be no model, as in the
    list of models."""
    write_release(store_root, "resnet", "r1", {"config.pbtxt": CONFIG})
    (store_root / "alias").symlink_to(store_root / "resnet")

    with pytest.raises(ModelNotFound):
        LocalStore(store_root).list_releases("alias")


def test_list_releases_in_natural_order_with_completeness(store_root: Path) -> None:
    for release in ("r10", "r2", "r1"):
        write_release(store_root, "m", release, {"config.pbtxt": CONFIG})
    write_release(store_root, "m", "r3", {"config.pbtxt": CONFIG}, manifest=False)
    (store_root / "m" / "notes.txt").write_text("not a release", encoding="utf-8")
    (store_root / "m" / ".partial").mkdir()
    (store_root / "m" / "latest").symlink_to(store_root / "m" / "r10")

    releases = LocalStore(store_root).list_releases("m")

    assert [(r.model, r.name, r.complete) for r in releases] == [
        ("m", "r1", True),
        ("m", "r2", True),
        ("m", "r3", False),
        ("m", "r10", True),
    ]
    # A complete release carries the revision of its SHA256SUMS; an incomplete one none.
    assert [r.revision is not None for r in releases] == [True, True, False, True]


def test_republishing_sha256sums_changes_the_revision(store_root: Path) -> None:
    root = write_release(store_root, "m", "r1", {"config.pbtxt": CONFIG})
    store = LocalStore(store_root)
    before = store.describe("m", "r1").revision
    (root / MANIFEST_NAME).write_text((root / MANIFEST_NAME).read_text() + "\n")
    assert store.describe("m", "r1").revision != before


def test_a_manifest_dir_does_not_make_a_release_complete(store_root: Path) -> None:
    root = write_release(store_root, "m", "r1", {"config.pbtxt": CONFIG}, manifest=False)
    (root / MANIFEST_NAME).mkdir()
    assert LocalStore(store_root).list_releases("m") == [ReleaseInfo("m", "r1", False)]


def test_list_store_is_the_models_then_each_models_releases(store_root: Path) -> None:
    for model, release in (("resnet", "r1"), ("resnet", "r2"), ("bert10", "r1"), ("bert2", "r1")):
        write_release(store_root, model, release, {"config.pbtxt": CONFIG})
    write_release(store_root, "resnet", "r 5", {"config.pbtxt": CONFIG})
    (store_root / "with space").mkdir()
    (store_root / "empty").mkdir()
    store = LocalStore(store_root)
    ignored: list[tuple[str | None, str]] = []

    listed = store.list_store(ignored=lambda model, entry: ignored.append((model, entry.name)))

    assert list(listed) == ["bert2", "bert10", "empty", "resnet"]
    assert listed == {model: store.list_releases(model) for model in store.list_models()}
    assert set(ignored) == {(None, "with space"), ("resnet", "r 5")}


def test_list_store_leaves_out_a_model_gone_since_the_models_were_listed(
    store_root: Path,
) -> None:
    class Racing(LocalStore):
        def list_models(self, **kwargs: Any) -> list[str]:
            return [*super().list_models(**kwargs), "vanished"]  # removed right after

    write_release(store_root, "m", "r1", {"config.pbtxt": CONFIG})

    assert list(Racing(store_root).list_store()) == ["m"]


def test_list_store_of_a_missing_store_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable):
        LocalStore(tmp_path / "gone").list_store()


def test_list_releases_of_an_unknown_model(store_root: Path) -> None:
    with pytest.raises(ModelNotFound) as caught:
        LocalStore(store_root).list_releases("ghost")
    assert caught.value.code == "model_not_found"
    assert "'ghost'" in caught.value.message


def test_describe(store_root: Path) -> None:
    write_release(store_root, "m", "r1", {"config.pbtxt": CONFIG})
    write_release(store_root, "m", "r2", {"config.pbtxt": CONFIG}, manifest=False)
    store = LocalStore(store_root)
    assert store.describe("m", "r1").complete is True
    assert store.describe("m", "r2") == ReleaseInfo("m", "r2", False)
    assert manifest_of(store, "m", "r2") is None
    manifest = manifest_of(store, "m", "r1")
    assert manifest is not None
    assert set(manifest) == {"config.pbtxt"}


@pytest.mark.parametrize(("model", "release"), [("m", "r9"), ("ghost", "r1")])
def test_describe_a_missing_release(store_root: Path, model: str, release: str) -> None:
    write_release(store_root, "m", "r1", {"config.pbtxt": CONFIG})
    with pytest.raises(ReleaseNotFound) as caught:
        LocalStore(store_root).describe(model, release)
    assert caught.value.code == "release_not_found"
    assert repr(release) in caught.value.message


def test_describe_refuses_a_symlinked_release(store_root: Path) -> None:
    write_release(store_root, "m", "r1", {"config.pbtxt": CONFIG})
    (store_root / "m" / "r2").symlink_to(store_root / "m" / "r1")
    with pytest.raises(ReleaseNotFound):
        LocalStore(store_root).describe("m", "r2")


def test_fetch_copies_every_file_with_its_digest(store_root: Path, tmp_path: Path) -> None:
    files = release_files()
    write_release(store_root, "m", "r1", files)
    dest = tmp_path / "staging" / "op" / "model"
    dest.parent.mkdir(parents=True)
    seen: list[FetchProgress] = []

    fetched = fetch(LocalStore(store_root), "m", "r1", dest, progress=seen.append)

    manifest_bytes = (store_root / "m" / "r1" / MANIFEST_NAME).read_bytes()
    everything = {**files, MANIFEST_NAME: manifest_bytes}
    assert dict(fetched.files) == {
        rel: FileDigest(size=len(data), sha256=hashlib.sha256(data).hexdigest())
        for rel, data in everything.items()
    }
    assert fetched.manifest == {rel: hashlib.sha256(d).hexdigest() for rel, d in files.items()}
    assert fetched.bytes_total == sum(len(d) for d in everything.values())
    for rel, data in everything.items():
        assert (dest / rel).read_bytes() == data
    on_disk = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()}
    assert on_disk == set(everything)

    assert [p.files_done for p in seen] == list(range(1, len(everything) + 1))
    assert all(p.files_total == len(everything) for p in seen)
    assert all(p.bytes_total == fetched.bytes_total for p in seen)
    done = [p.bytes_done for p in seen]
    assert done == sorted(done)
    assert done[-1] == fetched.bytes_total


def test_fetch_without_a_manifest(store_root: Path, tmp_path: Path) -> None:
    write_release(store_root, "m", "r1", {"config.pbtxt": CONFIG}, manifest=False)
    fetched = fetch(LocalStore(store_root), "m", "r1", tmp_path / "dest")
    assert fetched.manifest is None
    assert set(fetched.files) == {"config.pbtxt"}
    assert fetched.bytes_total == len(CONFIG)


def test_fetch_of_a_missing_release(store_root: Path, tmp_path: Path) -> None:
    (store_root / "m").mkdir()
    with pytest.raises(ReleaseNotFound):
        fetch(LocalStore(store_root), "m", "r1", tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_fetch_skips_files_the_cache_already_placed(store_root: Path, tmp_path: Path) -> None:
    files = release_files()
    write_release(store_root, "m", "r1", files)
    dest = tmp_path / "dest"
    dest.mkdir()
    cached = dest / "config.pbtxt"
    cached.write_bytes(files["config.pbtxt"])
    inode = cached.stat().st_ino
    digest = FileDigest(
        len(files["config.pbtxt"]), hashlib.sha256(files["config.pbtxt"]).hexdigest()
    )

    fetched = fetch(LocalStore(store_root), "m", "r1", dest, have={"config.pbtxt": digest})

    assert cached.stat().st_ino == inode  # not written again
    assert fetched.files["config.pbtxt"] == digest
    assert fetched.bytes_fetched == fetched.bytes_total - digest.size


@pytest.mark.parametrize("target_kind", ["file", "dir"])
def test_a_symlink_inside_a_release_is_refused_and_not_followed(
    store_root: Path, tmp_path: Path, target_kind: str
) -> None:
    secret = tmp_path / "outside"
    if target_kind == "file":
        secret.write_bytes(b"secret")
    else:
        secret.mkdir()
        (secret / "key").write_bytes(b"secret")
    root = write_release(store_root, "m", "r1", {"config.pbtxt": CONFIG, "1/model.py": MODEL_PY})
    (root / "1" / "link").symlink_to(secret)
    dest = tmp_path / "dest"

    with pytest.raises(UnsafeRelease) as caught:
        fetch(LocalStore(store_root), "m", "r1", dest)

    assert caught.value.code == "invalid_release"
    assert "symlink" in caught.value.message
    assert "'1/link'" in caught.value.message
    assert not dest.exists()  # refused before anything was copied


@pytest.mark.parametrize(
    ("model", "release"),
    [("../store", "r1"), ("m", "../../etc"), ("m", "a/b"), (".hidden", "r1"), ("m", "")],
)
def test_invalid_names_are_refused_before_touching_disk(
    tmp_path: Path, model: str, release: str
) -> None:
    # The store root does not exist: a refusal that came from the disk would be NotFound.
    store = LocalStore(tmp_path / "absent")
    dest = tmp_path / "dest"
    with pytest.raises(InvalidName):
        store.describe(model, release)
    with pytest.raises(InvalidName):
        fetch(store, model, release, dest)
    assert not dest.exists()
    if release == "r1":
        with pytest.raises(InvalidName):
            store.list_releases(model)
    assert not (tmp_path / "absent").exists()


def test_fetch_refuses_a_symlinked_release_dir(store_root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.pbtxt").write_bytes(CONFIG)
    (store_root / "m").mkdir()
    (store_root / "m" / "r2").symlink_to(outside)
    dest = tmp_path / "dest"

    with contextlib.suppress(ReleaseNotFound, UnsafeRelease):
        fetch(LocalStore(store_root), "m", "r2", dest)
    assert not dest.exists(), "a release dir that is a symlink was followed and copied"


def test_list_files_gives_every_file_with_its_size_and_copies_nothing(
    store_root: Path, tmp_path: Path
) -> None:
    files = release_files()
    root = write_release(store_root, "m", "r1", files)
    sparse = root / "1" / "huge.bin"
    with sparse.open("wb") as out:
        out.truncate(50 * 1024**3)  # apparent size; no block is written

    listing = LocalStore(store_root).list_files("m", "r1")

    assert listing.sizes == {
        **{rel: len(data) for rel, data in files.items()},
        "1/huge.bin": 50 * 1024**3,
        MANIFEST_NAME: (root / MANIFEST_NAME).stat().st_size,
    }
    assert (listing.model, listing.release) == ("m", "r1")


def test_fetch_writes_only_the_files_of_its_listing(store_root: Path, tmp_path: Path) -> None:
    root = write_release(store_root, "m", "r1", release_files())
    (root / "1" / "stray.bin").write_bytes(b"not in SHA256SUMS")
    store = LocalStore(store_root)
    manifest = manifest_of(store, "m", "r1")
    assert manifest is not None
    listing = store.list_files("m", "r1").only({*manifest, MANIFEST_NAME})
    dest = tmp_path / "dest"

    fetched = store.fetch(listing, dest, manifest=manifest)

    assert "1/stray.bin" not in fetched.files
    assert not (dest / "1" / "stray.bin").exists()
    assert set(fetched.files) == {*manifest, MANIFEST_NAME}


@pytest.mark.parametrize("change", [b"grown by a few bytes", b""])
def test_a_file_that_changes_size_after_the_listing_is_release_changed(
    store_root: Path, tmp_path: Path, change: bytes
) -> None:
    root = write_release(store_root, "m", "r1", release_files())
    store = LocalStore(store_root)
    manifest = manifest_of(store, "m", "r1")
    listing = store.list_files("m", "r1")
    weights = root / "1" / "data" / "weights.bin"
    if change:
        with weights.open("ab") as out:
            out.write(change)
    else:
        weights.write_bytes(weights.read_bytes()[:1000])
    dest = tmp_path / "dest"

    with pytest.raises(ReleaseChanged, match=r"m/r1/1/data/weights.bin (grew|shrank)"):
        store.fetch(listing, dest, manifest=manifest)

    assert not [p for p in dest.rglob("*") if "weights" in p.name]  # no copy, no temp file


def test_a_file_that_hashes_wrong_twice_is_returned_as_it_is_after_a_second_copy(
    store_root: Path, tmp_path: Path
) -> None:
    root = write_release(store_root, "m", "r1", release_files())
    (root / "1" / "model.py").write_bytes(MODEL_PY.replace(b"pass", b"PASS"))  # same size
    telemetry = CountedRetries()

    fetched = fetch(LocalStore(store_root, telemetry=telemetry), "m", "r1", tmp_path / "dest")

    wrong = hashlib.sha256(MODEL_PY.replace(b"pass", b"PASS")).hexdigest()
    assert fetched.files["1/model.py"].sha256 == wrong  # verification will refuse it
    assert fetched.refetched == 1
    assert telemetry.retries == [RetryCause.CORRUPT]
    assert not [p for p in (tmp_path / "dest").rglob("*.part")]


def test_a_manifest_that_is_not_utf8_is_an_invalid_release(store_root: Path) -> None:
    root = write_release(store_root, "m", "r1", {"config.pbtxt": CONFIG})
    (root / MANIFEST_NAME).write_bytes(b"\xff\xfe" + (root / MANIFEST_NAME).read_bytes())

    with pytest.raises(UnsafeRelease, match=r"SHA256SUMS of m/r1 is not UTF-8.*0xff at offset 0"):
        manifest_of(LocalStore(store_root), "m", "r1")


def test_a_cancelled_fetch_stops_and_leaves_no_temp_file(store_root: Path, tmp_path: Path) -> None:
    write_release(store_root, "m", "r1", release_files())
    cancel = threading.Event()
    dest = tmp_path / "dest"
    seen: list[FetchProgress] = []

    def cancel_after_the_first_file(progress: FetchProgress) -> None:
        seen.append(progress)
        cancel.set()

    with pytest.raises(Interrupted, match="cancelled"):
        fetch(
            LocalStore(store_root),
            "m",
            "r1",
            dest,
            progress=cancel_after_the_first_file,
            cancel=cancel,
        )

    assert len(seen) == 1  # nothing was copied after the signal
    assert not [p for p in dest.rglob("*") if p.name.endswith(".part")]


def test_a_fetch_cancelled_before_it_starts_writes_nothing(
    store_root: Path, tmp_path: Path
) -> None:
    write_release(store_root, "m", "r1", release_files())
    cancel = threading.Event()
    cancel.set()
    dest = tmp_path / "dest"
    store = LocalStore(store_root)
    listing = store.list_files("m", "r1").only({"1/data/weights.bin"})

    with pytest.raises(Interrupted):
        store.fetch(listing, dest, manifest=None, cancel=cancel)

    assert [p for p in dest.rglob("*") if p.is_file()] == []


def test_a_huge_manifest_is_neither_read_nor_held_in_memory(store_root: Path) -> None:
    root = write_release(store_root, "m", "r1", {"config.pbtxt": CONFIG}, manifest=False)
    with (root / MANIFEST_NAME).open("wb") as out:
        out.truncate(20 * 1024**3)  # sparse: 20 GiB of apparent size
    store = LocalStore(store_root)

    (info,) = store.list_releases("m")  # the watcher's scan does not read it

    assert info.complete
    assert info.revision is not None
    with pytest.raises(UnsafeRelease, match=r"SHA256SUMS of m/r1 is 21474836480 bytes, more than"):
        manifest_of(store, "m", "r1")
