"""``SHA256SUMS``: parsing coreutils output, refusing unsafe paths, choosing what a fetch
copies from the store's listing, comparing with a fetch."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from controlplane.domain.checksums import (
    MANIFEST_NAME,
    FileDigest,
    compare_manifest,
    decode_manifest,
    parse_manifest,
    safe_relpath,
    select_files,
)
from controlplane.domain.errors import ChecksumMismatch, ReleaseChanged, UnsafeRelease

H1 = hashlib.sha256(b"one").hexdigest()
H2 = hashlib.sha256(b"two").hexdigest()


def digest(data: bytes) -> FileDigest:
    return FileDigest(size=len(data), sha256=hashlib.sha256(data).hexdigest())


# --- parse_manifest --------------------------------------------------------------------


def test_text_and_binary_forms_are_parsed() -> None:
    text = f"{H1}  config.pbtxt\n{H2} *1/model.py\n"
    assert parse_manifest(text) == {"config.pbtxt": H1, "1/model.py": H2}


def test_blank_lines_and_crlf_are_ignored() -> None:
    text = f"\n{H1}  a\r\n   \n\n{H2}  b/c\n\n"
    assert parse_manifest(text) == {"a": H1, "b/c": H2}


def test_uppercase_hex_is_lowered() -> None:
    assert parse_manifest(f"{H1.upper()}  a\n") == {"a": H1}


def test_paths_with_spaces_are_kept_whole() -> None:
    assert parse_manifest(f"{H1}  dir with space/file name.bin\n") == {
        "dir with space/file name.bin": H1
    }


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "../x", "a/../../x", "a//b", "a/./b", "a\\b", "..\\x", "a/", "."],
)
def test_unsafe_paths_are_refused(path: str) -> None:
    with pytest.raises(UnsafeRelease) as caught:
        parse_manifest(f"{H1}  {path}\n")
    assert caught.value.code == "invalid_release"
    assert "not allowed in a release" in caught.value.message
    assert repr(path) in caught.value.message


def test_a_leading_dot_slash_is_refused_with_how_to_write_the_manifest() -> None:
    """``find . | xargs sha256sum`` writes ``./1/model.py``; the error says what to do."""
    with pytest.raises(UnsafeRelease) as caught:
        parse_manifest(f"{H1}  ./1/model.py\n")
    assert caught.value.code == "invalid_release"
    assert "'./1/model.py'" in caught.value.message
    assert "without a leading './'" in caught.value.message


def test_absolute_path_error_says_absolute() -> None:
    with pytest.raises(UnsafeRelease, match="absolute path '/etc/passwd'"):
        parse_manifest(f"{H1}  /etc/passwd\n")


def test_duplicate_entries_are_refused() -> None:
    with pytest.raises(UnsafeRelease, match=r"lists 'a' twice \(line 2\)") as caught:
        parse_manifest(f"{H1}  a\n{H2}  a\n")
    assert caught.value.code == "invalid_release"


def test_duplicate_in_text_and_binary_form_is_refused() -> None:
    with pytest.raises(UnsafeRelease, match="twice"):
        parse_manifest(f"{H1}  a\n{H1} *a\n")


def test_the_manifest_must_not_list_itself() -> None:
    with pytest.raises(UnsafeRelease, match="must not list itself") as caught:
        parse_manifest(f"{H1}  a\n{H2}  {MANIFEST_NAME}\n")
    assert caught.value.code == "invalid_release"


@pytest.mark.parametrize(
    "line",
    [
        "not a manifest",
        f"{H1[:-1]}  short-hash",
        f"{H1}0  long-hash",
        f"{H1[:-1]}g  not-hex",
        f"{H1}a",
        f"{H1}  ",
        f"{H1}\ta",
        f"\\{H1}  escaped\\nname",
    ],
)
def test_malformed_lines_are_refused_with_their_number(line: str) -> None:
    with pytest.raises(UnsafeRelease) as caught:
        parse_manifest(f"{H1}  fine\n{line}\n")
    assert caught.value.code == "invalid_release"
    assert f"{MANIFEST_NAME} line 2 is not" in caught.value.message


@pytest.mark.parametrize("text", ["", "\n", "  \n\n\t\n"])
def test_an_empty_manifest_is_refused(text: str) -> None:
    with pytest.raises(UnsafeRelease, match="lists no files") as caught:
        parse_manifest(text)
    assert caught.value.code == "invalid_release"


def test_safe_relpath_accepts_nested_relative_paths() -> None:
    assert safe_relpath("1/model.py").parts == ("1", "model.py")


def test_safe_relpath_refuses_nul() -> None:
    with pytest.raises(UnsafeRelease):
        safe_relpath("a\x00b")


# --- against real coreutils output -----------------------------------------------------


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_real_sha256sum_output_parses_and_matches_hashlib(tmp_path: Path, binary: bool) -> None:
    contents = {
        "config.pbtxt": b'name: "m"\nbackend: "python"\n',
        "1/model.py": b"print('hi')\n",
        "1/weights.bin": bytes(range(256)) * 1000,
        "empty": b"",
        "dir with space/x.txt": b"spaced",
    }
    for rel, data in contents.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    args = ["sha256sum", *(["--binary"] if binary else []), "--", *sorted(contents)]
    output = subprocess.run(
        args, cwd=tmp_path, capture_output=True, text=True, check=True, timeout=30
    ).stdout
    assert ("*" in output) is binary  # the form under test really was produced

    manifest = parse_manifest(output)

    assert manifest == {rel: hashlib.sha256(data).hexdigest() for rel, data in contents.items()}
    compare_manifest(manifest, {rel: digest(data) for rel, data in contents.items()})


# --- compare_manifest ------------------------------------------------------------------


def test_matching_files_pass() -> None:
    compare_manifest({"a": H1, "b/c": H2}, {"a": digest(b"one"), "b/c": digest(b"two")})


def test_manifest_itself_among_fetched_files_is_not_extra() -> None:
    compare_manifest({"a": H1}, {"a": digest(b"one"), MANIFEST_NAME: digest(b"whatever")})


def test_a_different_hash_is_a_checksum_mismatch_naming_the_file() -> None:
    with pytest.raises(ChecksumMismatch) as caught:
        compare_manifest({"a": H1, "b/c": H2}, {"a": digest(b"one"), "b/c": digest(b"tampered")})
    error = caught.value
    assert error.code == "checksum_mismatch"
    assert "b/c" in error.message
    assert "do not match" in error.message
    assert error.details == {"files": ["b/c"]}


def test_a_missing_file_is_a_checksum_mismatch_naming_the_file() -> None:
    with pytest.raises(ChecksumMismatch) as caught:
        compare_manifest({"a": H1, "gone.bin": H2}, {"a": digest(b"one")})
    assert caught.value.code == "checksum_mismatch"
    assert "missing" in caught.value.message
    assert "gone.bin" in caught.value.message
    assert caught.value.details == {"files": ["gone.bin"]}


def test_an_extra_file_is_an_unsafe_release_naming_the_file() -> None:
    with pytest.raises(UnsafeRelease) as caught:
        compare_manifest({"a": H1}, {"a": digest(b"one"), "smuggled.so": digest(b"x")})
    assert caught.value.code == "invalid_release"
    assert "smuggled.so" in caught.value.message
    assert "not listed" in caught.value.message


def test_size_alone_does_not_decide_a_match() -> None:
    with pytest.raises(ChecksumMismatch):
        compare_manifest({"a": H1}, {"a": FileDigest(size=3, sha256=H2)})


# --- choosing what a fetch copies ---------------------------------------------------------


def _manifest(*paths: str) -> dict[str, str]:
    return {path: "0" * 64 for path in paths}


def test_a_fetch_copies_what_sha256sums_lists_and_sha256sums_itself() -> None:
    listed = {"config.pbtxt": 10, "1/model.py": 20, MANIFEST_NAME: 30}
    assert select_files(_manifest("config.pbtxt", "1/model.py"), listed) == listed


def test_without_a_manifest_a_fetch_copies_everything_listed() -> None:
    assert select_files(None, {"a": 1, "b/c": 2}) == {"a": 1, "b/c": 2}


def test_files_sha256sums_does_not_list_are_refused_naming_them() -> None:
    listed = {"config.pbtxt": 10, "1/huge.bin": 100 * 1024**3, ".DS_Store": 6, MANIFEST_NAME: 1}

    with pytest.raises(UnsafeRelease) as caught:
        select_files(_manifest("config.pbtxt"), listed)

    assert caught.value.code == "invalid_release"
    assert "2 file(s) are not listed in SHA256SUMS: .DS_Store, 1/huge.bin" in caught.value.message
    assert caught.value.details == {"files": [".DS_Store", "1/huge.bin"]}


def test_a_listed_file_the_store_lacks_is_a_checksum_mismatch() -> None:
    with pytest.raises(ChecksumMismatch, match=r"listed in SHA256SUMS are missing: 1/model\.py"):
        select_files(_manifest("config.pbtxt", "1/model.py"), {"config.pbtxt": 1, MANIFEST_NAME: 1})


def test_a_manifest_gone_from_the_listing_is_a_release_being_republished() -> None:
    with pytest.raises(ReleaseChanged):
        select_files(_manifest("config.pbtxt"), {"config.pbtxt": 1})


def test_manifest_bytes_that_are_not_utf8_are_an_invalid_release_naming_the_byte() -> None:
    data = f"{'0' * 64}  caf\xe9.bin\n".encode("latin-1")
    with pytest.raises(UnsafeRelease) as caught:
        decode_manifest(data, "m/r1")
    assert caught.value.code == "invalid_release"
    assert "SHA256SUMS of m/r1 is not UTF-8 text (byte 0xe9 at offset 69)" in caught.value.message


def test_a_listed_manifest_too_large_to_read_is_refused() -> None:
    with pytest.raises(UnsafeRelease, match="more than the 16777216 a manifest may have"):
        select_files(_manifest("a"), {"a": 1, MANIFEST_NAME: 10 * 1024**3})


def test_a_model_sig_manifest_selects_its_files_and_leaves_the_markers() -> None:
    """``with_sums=False``: the manifest is a model.sig's; SHA256SUMS (published since) and
    the signatures are neither fetched nor extra files, and refusals name model.sig."""
    listed = {"config.pbtxt": 1, "1/model.py": 2, "model.sig": 3, MANIFEST_NAME: 4}
    chosen = select_files(
        _manifest("config.pbtxt", "1/model.py"), listed, with_sums=False, named="model.sig"
    )
    assert chosen == {"config.pbtxt": 1, "1/model.py": 2}
    assert select_files(None, listed) == {"config.pbtxt": 1, "1/model.py": 2, MANIFEST_NAME: 4}
    with pytest.raises(UnsafeRelease, match=r"not listed in model\.sig: extra\.bin"):
        select_files(
            _manifest("config.pbtxt"),
            {"config.pbtxt": 1, "extra.bin": 1},
            with_sums=False,
            named="model.sig",
        )
    with pytest.raises(ChecksumMismatch, match=r"listed in model\.sig are missing: 1/model\.py"):
        select_files(
            _manifest("config.pbtxt", "1/model.py"),
            {"config.pbtxt": 1},
            with_sums=False,
            named="model.sig",
        )
