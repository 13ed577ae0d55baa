"""The keyring verifies what plain openssl signs, names who signed, and refuses the rest with
the code that says why. Keys and signatures are made by the real openssl binary."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from controlplane.adapters.keyring import Keyring, KeyringError
from controlplane.domain.errors import SignatureInvalid, SignatureUnbound, UnknownSigner
from controlplane.domain.signatures import Trust, trust_of
from tests.support.signing import PublisherKey, make_key, openssl

SUMS = b"0" * 64 + b"  1/model.py\n" + b"1" * 64 + b"  config.pbtxt\n"


def now() -> datetime:
    return datetime.now(UTC)


def signed(
    tmp_path: Path, key: PublisherKey, data: bytes = SUMS, model: str = "m", release: str = "r1"
) -> bytes:
    sums = tmp_path / "work" / "SHA256SUMS"
    sums.parent.mkdir(exist_ok=True)
    sums.write_bytes(data)
    return key.sign(sums, model, release).read_bytes()


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    return tmp_path / "keyring"


@pytest.mark.parametrize("kind", ["ed25519", "p256", "p384"])
def test_a_signature_plain_openssl_wrote_names_its_key(
    tmp_path: Path, keys: Path, kind: str
) -> None:
    key = make_key(tmp_path / "private", "publisher-a", kind)  # type: ignore[arg-type]
    key.public_pem(keys / "publisher-a.pem")
    signature = signed(tmp_path, key)
    assert Keyring([keys], now=now).verify_release("m", "r1", SUMS, signature) == "publisher-a"


def test_any_key_of_the_keyring_may_sign(tmp_path: Path, keys: Path) -> None:
    old = make_key(tmp_path / "private", "old", "p256")
    new = make_key(tmp_path / "private", "new")
    old.public_pem(keys / "old.pem")
    new.public_pem(keys / "new.pem")
    keyring = Keyring([keys], now=now)
    assert keyring.verify_release("m", "r1", SUMS, signed(tmp_path, old)) == "old"
    assert keyring.verify_release("m", "r2", SUMS, signed(tmp_path, new, release="r2")) == "new"


def test_changed_bytes_and_a_foreign_key_are_signature_invalid_naming_both_causes(
    tmp_path: Path, keys: Path
) -> None:
    mine = make_key(tmp_path / "private", "mine")
    stranger = make_key(tmp_path / "private", "stranger")
    mine.public_pem(keys / "mine.pem")
    keyring = Keyring([keys], now=now)
    for data, signature in [
        (SUMS + b"2" * 64 + b"  extra.bin\n", signed(tmp_path, mine)),  # edited after signing
        (SUMS, signed(tmp_path, stranger)),  # a key the keyring does not hold
    ]:
        with pytest.raises(SignatureInvalid) as caught:
            keyring.verify_release("m", "r1", data, signature)
        message = caught.value.message
        assert caught.value.code == "signature_invalid"
        assert "changed after it was signed" in message
        assert "a key the keyring does not hold" in message
        assert "trusted keys: mine" in message


@pytest.mark.parametrize("kind", ["ed25519", "p256"])
@pytest.mark.parametrize(("model", "release"), [("m", "r9"), ("other", "r1"), ("other", "r9")])
def test_a_signature_verifies_only_for_the_model_and_release_it_names(
    tmp_path: Path, keys: Path, kind: str, model: str, release: str
) -> None:
    """A signed release copied whole under another release or model name (write access to the
    bucket is enough) carries a signature over the same SHA256SUMS bytes: it must not verify
    there."""
    key = make_key(tmp_path / "private", "mine", kind)  # type: ignore[arg-type]
    key.public_pem(keys / "mine.pem")
    signature = signed(tmp_path, key, model="m", release="r1")
    keyring = Keyring([keys], now=now)
    assert keyring.verify_release("m", "r1", SUMS, signature) == "mine"

    with pytest.raises(SignatureInvalid) as caught:
        keyring.verify_release(model, release, SUMS, signature)
    assert f"of release {release!r} of {model!r}" in caught.value.message
    assert "signed for another model or release" in caught.value.message


@pytest.mark.parametrize("kind", ["ed25519", "p256"])
def test_a_signature_over_sha256sums_alone_is_refused_saying_how_to_sign_it_again(
    tmp_path: Path, keys: Path, kind: str
) -> None:
    key = make_key(tmp_path / "private", "mine", kind)  # type: ignore[arg-type]
    key.public_pem(keys / "mine.pem")
    sums = tmp_path / "work" / "SHA256SUMS"
    sums.parent.mkdir()
    sums.write_bytes(SUMS)
    old_way = key.sign_unbound(sums).read_bytes()

    with pytest.raises(SignatureUnbound) as caught:
        Keyring([keys], now=now).verify_release("m", "r1", SUMS, old_way)

    message = caught.value.message
    assert caught.value.code == "signature_unbound"
    assert "was made over SHA256SUMS alone (by key 'mine'), the old way" in message
    assert "printf 'controlplane-release v1\\nmodel %s\\nrelease %s\\n' m r1" in message
    assert "openssl pkeyutl -sign -inkey key.pem -rawin -in /tmp/statement" in message


def test_garbage_is_no_signature(tmp_path: Path, keys: Path) -> None:
    make_key(tmp_path / "private", "mine").public_pem(keys / "mine.pem")
    with pytest.raises(SignatureInvalid, match="not a signature openssl writes"):
        Keyring([keys], now=now).verify_release("m", "r1", SUMS, b"hello\n")


def test_an_expired_certificate_is_an_unknown_signer_with_the_date(
    tmp_path: Path, keys: Path
) -> None:
    key = make_key(tmp_path / "private", "lapsed")
    key.certificate(keys / "lapsed.pem", days=-1)
    with pytest.raises(UnknownSigner, match=r"key 'lapsed' expired on \d{4}-\d\d-\d\d") as caught:
        Keyring([keys], now=now).verify_release("m", "r1", SUMS, signed(tmp_path, key))
    assert caught.value.code == "unknown_signer"


def test_a_valid_certificate_is_trusted_until_its_not_after(tmp_path: Path, keys: Path) -> None:
    key = make_key(tmp_path / "private", "certified", "p256")
    key.certificate(keys / "certified.pem", days=30)
    signature = signed(tmp_path, key)
    assert Keyring([keys], now=now).verify_release("m", "r1", SUMS, signature) == "certified"
    later = Keyring([keys], now=lambda: now() + timedelta(days=31))
    with pytest.raises(UnknownSigner, match="expired on"):
        later.verify_release("m", "r1", SUMS, signature)
    earlier = Keyring([keys], now=lambda: now() - timedelta(days=1))
    with pytest.raises(UnknownSigner, match="not valid before"):
        earlier.verify_release("m", "r1", SUMS, signature)


def test_a_retired_key_is_an_unknown_signer_and_a_deleted_one_signature_invalid(
    tmp_path: Path, keys: Path
) -> None:
    key = make_key(tmp_path / "private", "gone")
    make_key(tmp_path / "private", "current").public_pem(keys / "current.pem")
    key.public_pem(keys / "retired" / "gone.pem")
    signature = signed(tmp_path, key)
    keyring = Keyring([keys], now=now)
    with pytest.raises(UnknownSigner, match=r"key 'gone' is retired"):
        keyring.verify_release("m", "r1", SUMS, signature)
    shutil.rmtree(keys / "retired")
    with pytest.raises(SignatureInvalid, match="trusted keys: current"):
        keyring.verify_release("m", "r1", SUMS, signature)


def test_a_key_added_while_running_counts_at_the_next_verification(
    tmp_path: Path, keys: Path
) -> None:
    make_key(tmp_path / "private", "first").public_pem(keys / "first.pem")
    second = make_key(tmp_path / "private", "second", "p256")
    keyring = Keyring([keys], now=now)
    signature = signed(tmp_path, second)
    with pytest.raises(SignatureInvalid):
        keyring.verify_release("m", "r1", SUMS, signature)
    second.public_pem(keys / "second.pem")
    assert keyring.verify_release("m", "r1", SUMS, signature) == "second"


def test_a_list_of_pem_files_is_a_keyring(tmp_path: Path) -> None:
    key = make_key(tmp_path / "private", "listed")
    pem = key.public_pem(tmp_path / "elsewhere" / "listed.pem")
    other = make_key(tmp_path / "private", "other").public_pem(tmp_path / "other.pem")
    keyring = Keyring([other, pem], now=now)
    assert keyring.check() == ["other", "listed"]
    assert keyring.verify_release("m", "r1", SUMS, signed(tmp_path, key)) == "listed"


def test_a_keyring_that_cannot_be_read_trusts_nothing_and_names_its_path(
    tmp_path: Path, keys: Path
) -> None:
    key = make_key(tmp_path / "private", "mine")
    key.public_pem(keys / "mine.pem")
    signature = signed(tmp_path, key)
    missing = tmp_path / "nowhere"
    with pytest.raises(SignatureInvalid, match=f"keyring cannot be read \\({missing}"):
        Keyring([missing], now=now).verify_release("m", "r1", SUMS, signature)
    (keys / "broken.pem").write_text("-----BEGIN PUBLIC KEY-----\nnot base64\n")
    with pytest.raises(SignatureInvalid, match=r"broken\.pem is neither a PEM public key"):
        Keyring([keys], now=now).verify_release("m", "r1", SUMS, signature)


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024"), "an RSA key"),
        (("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-521"), "secp521r1"),
        (("genpkey", "-algorithm", "ed448"), "an Ed448 key"),
    ],
)
def test_other_key_types_are_refused_at_start_up_naming_the_file(
    tmp_path: Path, keys: Path, make: tuple[str, ...], said: str
) -> None:
    private = tmp_path / "other.key"
    openssl(*make, "-out", private)
    keys.mkdir()
    openssl("pkey", "-in", private, "-pubout", "-out", keys / "odd.pem")
    with pytest.raises(KeyringError, match=f"{keys / 'odd.pem'} holds .*{said}"):
        Keyring([keys], now=now).check()


def test_a_private_key_in_the_keyring_is_refused(tmp_path: Path, keys: Path) -> None:
    key = make_key(keys, "oops")
    with pytest.raises(KeyringError, match=f"{key.private} holds a private key"):
        Keyring([key.private], now=now).check()


def test_two_keys_of_one_name_are_refused(tmp_path: Path, keys: Path) -> None:
    key = make_key(tmp_path / "private", "twice")
    key.public_pem(keys / "twice.pem")
    key.public_pem(keys / "retired" / "twice.pem")
    with pytest.raises(KeyringError, match="two keys are named 'twice'"):
        Keyring([keys], now=now).check()


def test_trust_retired_wins_then_the_certificate_window() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    day = timedelta(days=1)
    assert trust_of("k", now=at).trust is Trust.TRUSTED
    assert trust_of("k", now=at, retired=True, not_after=at + day).trust is Trust.RETIRED
    assert trust_of("k", now=at, not_after=at - day).trust is Trust.EXPIRED
    assert trust_of("k", now=at, not_before=at + day).trust is Trust.NOT_YET_VALID
    assert trust_of("k", now=at, not_before=at - day, not_after=at + day).trust is Trust.TRUSTED
