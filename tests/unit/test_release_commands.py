"""``controlplane release check`` and ``release publish`` to a directory store, run as a CI job
runs them (the real command, in-process), on real release dirs: exit codes, the deploy's own
error codes, the order of the upload and a publish cut short then run again.

The same commands against a real daemon, Triton and moto's S3 are in
tests/integration/test_release_publish.py."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from controlplane.adapters.keyring import Keyring
from controlplane.cli.main import app
from controlplane.domain.checksums import decode_manifest, render_manifest
from controlplane.domain.errors import UnsafeRelease
from tests.support.models import corrupt_file, write_scale_release, write_sha256sums
from tests.support.signing import make_key

EXIT_FAILED, EXIT_USAGE = 1, 2


def run(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def document(result: Any) -> Any:
    return json.loads(result.stdout)


def release_dir(tmp_path: Path, *, checksums: bool = False, **kwargs: Any) -> Path:
    """A release as a publisher's build leaves it: no SHA256SUMS unless asked."""
    return write_scale_release(tmp_path / "build", "m", "r1", k=2.0, checksums=checksums, **kwargs)


def test_a_good_release_passes_with_exit_0_and_says_what_a_deploy_would_find(
    tmp_path: Path,
) -> None:
    path = release_dir(tmp_path)

    result = run("release", "check", str(path), "--model", "resnet", "-o", "json")

    assert result.exit_code == 0, result.output
    found = document(result)
    assert found["ok"] is True
    assert (found["model"], found["files"], found["backend"]) == ("resnet", 3, "python")
    assert [step["name"] for step in found["steps"]] == ["fetch", "verify", "check"]
    assert sorted(os.listdir(path)) == ["1", "config.pbtxt"]  # nothing written into DIR


def test_a_dir_that_ships_its_own_sha256sums_is_checked_against_it(tmp_path: Path) -> None:
    path = release_dir(tmp_path, checksums=True)
    assert run("release", "check", str(path)).exit_code == 0

    corrupt_file(path)
    result = run("release", "check", str(path), "-o", "json")

    assert result.exit_code == EXIT_FAILED
    assert document(result)["error"]["code"] == "checksum_mismatch"
    assert "1/model.py" in document(result)["error"]["message"]


def _symlink(path: Path) -> None:
    (path / "1" / "weights.bin").symlink_to("/etc/hostname")


def _unlisted(path: Path) -> None:
    write_sha256sums(path)
    (path / "1" / "extra.bin").write_bytes(b"x")


def _dotdot(path: Path) -> None:
    (path / "SHA256SUMS").write_text(f"{'0' * 64}  ../escape\n", encoding="utf-8")


def _bad_config(path: Path) -> None:
    (path / "config.pbtxt").write_text('backend: "python"\nno_such_field: 1\n', encoding="utf-8")


def _no_version_dir(path: Path) -> None:
    (path / "1" / "model.py").rename(path / "model.py")
    (path / "1").rmdir()


def _bad_smoke(path: Path) -> None:
    (path / "smoke.json").write_text('{"inputs": {}}', encoding="utf-8")


@pytest.mark.parametrize(
    ("breakage", "code", "said"),
    [
        (_symlink, "invalid_release", "symlink at '1/weights.bin'"),
        (_unlisted, "invalid_release", "1/extra.bin"),
        (_dotdot, "invalid_release", "'../escape'"),
        (_bad_config, "invalid_model_config", "no_such_field"),
        (_no_version_dir, "invalid_model_config", "no version dir"),
        (_bad_smoke, "preflight_failed", "smoke.json"),
    ],
)
def test_a_broken_release_is_refused_with_the_deploys_code_and_exit_1(
    tmp_path: Path, breakage: Any, code: str, said: str
) -> None:
    path = release_dir(tmp_path)
    breakage(path)

    result = run("release", "check", str(path), "-o", "json")

    assert result.exit_code == EXIT_FAILED, result.output
    error = document(result)["error"]
    assert error["code"] == code
    assert said in error["message"]


def test_python_that_does_not_compile_is_refused_naming_the_line(tmp_path: Path) -> None:
    path = release_dir(tmp_path, syntax_error=True)

    result = run("release", "check", str(path))

    assert result.exit_code == EXIT_FAILED
    assert "error: invalid_release: 1/model.py line" in result.stderr


def test_names_are_checked_by_the_daemons_rule_and_bad_usage_exits_2(tmp_path: Path) -> None:
    path = release_dir(tmp_path)

    assert run("release", "check", str(path), "--model", "a__b").exit_code == EXIT_USAGE
    assert run("release", "check", str(tmp_path / "nowhere")).exit_code == EXIT_USAGE
    publish = run("release", "publish", str(path), str(tmp_path / "store" / "x__y" / "r1"))
    assert publish.exit_code == EXIT_USAGE
    assert "invalid_name" in publish.stderr


def _store_files(release: Path) -> list[str]:
    return sorted(p.relative_to(release).as_posix() for p in release.rglob("*") if p.is_file())


def test_publish_to_a_directory_store_writes_the_files_then_sha256sums(tmp_path: Path) -> None:
    path = release_dir(tmp_path)
    (tmp_path / "my store").mkdir()  # a space in the path: no %20 on the way

    result = run("release", "publish", str(path), str(tmp_path / "my store" / "resnet" / "r1"))

    assert result.exit_code == 0, result.output
    published = tmp_path / "my store" / "resnet" / "r1"
    assert _store_files(published) == ["1/model.py", "SHA256SUMS", "config.pbtxt"]
    manifest = decode_manifest((published / "SHA256SUMS").read_bytes(), "r1")
    assert sorted(manifest) == ["1/model.py", "config.pbtxt"]
    lines = result.stdout.splitlines()
    assert lines.index(next(x for x in lines if "SHA256SUMS" in x)) > lines.index(
        next(x for x in lines if "config.pbtxt" in x)
    )
    assert not (path / "SHA256SUMS").exists()  # the user's dir is left as it was


def test_publishing_over_a_published_release_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    path = release_dir(tmp_path)
    (tmp_path / "store").mkdir()
    where = str(tmp_path / "store" / "resnet" / "r1")
    assert run("release", "publish", str(path), where).exit_code == 0
    before = (tmp_path / "store" / "resnet" / "r1" / "config.pbtxt").read_bytes()
    (path / "config.pbtxt").write_text(
        (path / "config.pbtxt").read_text() + "\n# changed\n", encoding="utf-8"
    )

    result = run("release", "publish", str(path), where, "-o", "json")

    assert result.exit_code == EXIT_FAILED
    error = document(result)["error"]
    assert error["code"] == "release_exists"
    assert "immutable" in error["message"]
    assert "new release name" in error["message"]
    assert (tmp_path / "store" / "resnet" / "r1" / "config.pbtxt").read_bytes() == before


def test_a_cut_publish_is_completed_by_a_rerun(tmp_path: Path) -> None:
    """What a publish killed half-way leaves: one file whole, another half-written in its temp
    file, a file of an older attempt that this release does not have. No marker."""
    path = release_dir(tmp_path)
    target = tmp_path / "store" / "resnet" / "r1"
    (target / "1").mkdir(parents=True)
    (target / "config.pbtxt").write_bytes((path / "config.pbtxt").read_bytes())
    (target / "1" / ".model.py.abc123.part").write_bytes(b"half")
    (target / "1" / "old.bin").write_bytes(b"from an older attempt")

    result = run("release", "publish", str(path), str(tmp_path / "store/resnet/r1"), "-o", "json")

    assert result.exit_code == 0, result.output
    done = document(result)
    assert done["kept"] == ["config.pbtxt"]
    assert done["uploaded"] == ["1/model.py"]
    assert sorted(done["removed"]) == ["1/.model.py.abc123.part", "1/old.bin"]
    assert _store_files(target) == ["1/model.py", "SHA256SUMS", "config.pbtxt"]
    assert (target / "1" / "model.py").read_bytes() == (path / "1" / "model.py").read_bytes()


def test_a_signed_publish_verifies_with_the_public_key_in_a_keyring(tmp_path: Path) -> None:
    key = make_key(tmp_path / "keys", "ci-2026", "p256")
    keyring = tmp_path / "keyring"
    key.public_pem(keyring / "ci-2026.pem")
    path = release_dir(tmp_path)
    (tmp_path / "store").mkdir()

    result = run(
        "release", "publish", str(path), str(tmp_path / "store/resnet/r1"), "--sign",
        str(key.private), "-o", "json",
    )  # fmt: skip

    assert result.exit_code == 0, result.output
    assert document(result)["signed_by"] == ["ci-2026"]
    published = tmp_path / "store" / "resnet" / "r1"
    ring = Keyring([keyring], now=lambda: datetime.now(UTC))
    signer = ring.verify_release(
        "resnet",
        "r1",
        (published / "SHA256SUMS").read_bytes(),
        (published / "SHA256SUMS.sig").read_bytes(),
    )
    assert signer == "ci-2026"


def test_the_manifest_is_written_as_sha256sum_writes_it() -> None:
    text = render_manifest({"config.pbtxt": "A" * 64, "1/model.py": "b" * 64})

    assert text == f"{'b' * 64}  1/model.py\n{'a' * 64}  config.pbtxt\n".encode()
    with pytest.raises(UnsafeRelease):
        render_manifest({"1/x\ny": "a" * 64})


def test_sign_as_without_a_key_is_bad_usage_and_publishes_nothing(tmp_path: Path) -> None:
    path = release_dir(tmp_path)
    (tmp_path / "store").mkdir()

    result = run(
        "release", "publish", str(path), str(tmp_path / "store" / "resnet" / "r1"),
        "--sign-as", "model.sig",
    )  # fmt: skip

    assert result.exit_code == EXIT_USAGE
    assert "--sign-as model.sig needs --sign KEY" in result.stderr
    assert not (tmp_path / "store" / "resnet").exists()
