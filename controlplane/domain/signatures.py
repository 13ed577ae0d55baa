"""Release signatures: what is signed, which keys are trusted now, and what a verification's
outcome means.

A publisher signs, with plain ``openssl``, a short statement naming the model and the release
followed by the bytes of ``SHA256SUMS`` (:func:`statement`), and publishes the result as
``SHA256SUMS.sig`` beside it (before it: ``SHA256SUMS`` stays the commit marker). Naming them
binds the signature to one place in the store: a signed release copied whole under another
release or model name does not verify there, so write access to the bucket cannot make a member
serve content under a name its publisher did not give it. A signature over ``SHA256SUMS``
alone (as this daemon took them before) is refused with its own code, ``signature_unbound``,
whose message gives the command that signs it again.

Such a signature carries no key id, so the verifier tries every key of the keyring; this module
judges what the tries found (:func:`judge`). The split of the refusals follows from that:

* a key the keyring trusts verifies it: the release is signed by that key (the *signer*);
* only a key the keyring holds but does not trust now verifies it (``unknown_signer``): the key
  was retired (moved into the keyring dir's ``retired/``) or its certificate is expired or not
  yet valid;
* no key verifies the statement, but one verifies ``SHA256SUMS`` alone
  (``signature_unbound``): signed the old way, for no model and release in particular;
* no key verifies it (``signature_invalid``): ``SHA256SUMS`` changed after it was signed, it
  was signed for another model or release (a release copied under another name), or a key the
  keyring does not hold signed it. No verifier can tell those apart.

Pure: the cryptography lives in :mod:`controlplane.adapters.keyring`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from controlplane.domain.checksums import MANIFEST_NAME, SIGNATURE_NAME
from controlplane.domain.errors import (
    SignatureInvalid,
    SignatureMissing,
    SignatureUnbound,
    UnknownSigner,
)

# An openssl signature is 64 bytes (Ed25519) or about 72 (ECDSA P-256, DER); anything much
# larger is no signature, and is not read into memory whole.
MAX_SIGNATURE_BYTES = 4096
RETIRED_DIR = "retired"
CA_DIR = "ca"  # a keyring dir's CA certificates, for model.sig's certificate mode
SIGNATURE_CODES = (
    SignatureMissing.code,
    SignatureInvalid.code,
    SignatureUnbound.code,
    UnknownSigner.code,
)
STATEMENT_HEADER = "controlplane-release v1"  # a new version of the statement gets a new line


def release_named(model: str, release: str) -> str:
    """How refusals name a release: ``release 'r1' of 'resnet'``."""
    return f"release {release!r} of {model!r}"


def statement(model: str, release: str, manifest: bytes) -> bytes:
    """What a release's signature is over: the header, the model, the release (one line
    each), then the bytes of its ``SHA256SUMS``. Names cannot hold a newline or a space
    (:mod:`.names`), so no two places in the store share a statement."""
    return f"{STATEMENT_HEADER}\nmodel {model}\nrelease {release}\n".encode() + manifest


def signing_command(model: str, release: str) -> str:
    """The shell commands that sign ``release`` of ``model``, run in the release's dir with
    the publisher's key (as docs/signatures.md shows): the statement goes to a file outside
    the release (Ed25519 signing reads a file, not a pipe), then one openssl command."""
    header = f"printf '{STATEMENT_HEADER}\\nmodel %s\\nrelease %s\\n' {model} {release}"
    return (
        f"`{{ {header}; cat {MANIFEST_NAME}; }} > /tmp/statement` then, for an Ed25519 key, "
        f"`openssl pkeyutl -sign -inkey key.pem -rawin -in /tmp/statement -out "
        f"{SIGNATURE_NAME}`, or for an ECDSA P-256 key, `openssl dgst -sha256 -sign key.pem "
        f"-out {SIGNATURE_NAME} /tmp/statement`"
    )


class Trust(StrEnum):
    TRUSTED = "trusted"
    RETIRED = "retired"  # moved into the keyring dir's retired/
    EXPIRED = "expired"  # its certificate's notAfter has passed
    NOT_YET_VALID = "not_yet_valid"  # its certificate's notBefore is still to come


@dataclass(frozen=True)
class KeyTrust:
    """One key of the keyring (named by its file's stem) and whether it is trusted now."""

    name: str
    trust: Trust
    at: datetime | None = None  # when it expired, or when it becomes valid

    def why(self) -> str:
        if self.trust is Trust.RETIRED:
            return f"key {self.name!r} is retired (it is in the keyring's {RETIRED_DIR}/)"
        when = self.at.isoformat() if self.at is not None else "?"
        if self.trust is Trust.EXPIRED:
            return f"key {self.name!r} expired on {when} (its certificate's notAfter)"
        if self.trust is Trust.NOT_YET_VALID:
            return f"key {self.name!r} is not valid before {when} (its certificate's notBefore)"
        return f"key {self.name!r} is trusted"


def trust_of(
    name: str,
    *,
    now: datetime,
    retired: bool = False,
    not_before: datetime | None = None,
    not_after: datetime | None = None,
) -> KeyTrust:
    """The trust of a key now: retired wins, then its certificate's validity (if any)."""
    if retired:
        return KeyTrust(name, Trust.RETIRED)
    if not_after is not None and now > not_after:
        return KeyTrust(name, Trust.EXPIRED, not_after)
    if not_before is not None and now < not_before:
        return KeyTrust(name, Trust.NOT_YET_VALID, not_before)
    return KeyTrust(name, Trust.TRUSTED)


def judge(
    where: str,
    keys: Sequence[KeyTrust],
    verified_by: Sequence[str],
    *,
    unbound_by: Sequence[str] = (),
    malformed: bool = False,
    sign_again: str = "",
) -> str:
    """The signer of ``where``'s signature, given the keys that verify it over its
    :func:`statement` (``verified_by``, names of ``keys``) and those that verify it over
    ``SHA256SUMS`` alone (``unbound_by``: signed the old way); or the refusal that says why
    there is none. ``sign_again``: the commands that sign it as it must be
    (:func:`signing_command`)."""
    verified = [key for key in keys if key.name in verified_by]
    for key in verified:
        if key.trust is Trust.TRUSTED:
            return key.name
    if verified:
        reasons = "; ".join(key.why() for key in verified)
        raise UnknownSigner(
            f"{SIGNATURE_NAME} of {where} was made by a key the keyring does not trust now: "
            f"{reasons}. Sign the release again with a trusted key and publish it again (or, "
            "if the key is to be trusted again, put it back in the keyring)",
            details={"keys": [key.name for key in verified]},
        )
    names = ", ".join(key.name for key in keys if key.trust is Trust.TRUSTED) or "none"
    unbound = [key.name for key in keys if key.name in unbound_by]
    if unbound:
        raise SignatureUnbound(
            f"{SIGNATURE_NAME} of {where} was made over {MANIFEST_NAME} alone (by key "
            f"{', '.join(repr(n) for n in unbound)}), the old way: such a signature names no "
            "model or release, so a copy of the release under another name would verify too, "
            "and it is refused. Sign the statement that names them and publish the new "
            f"{SIGNATURE_NAME} (the files and {MANIFEST_NAME} stay as they are): "
            f"{sign_again or 'see docs/signatures.md'}",
            details={"keys": unbound},
        )
    if malformed:
        raise SignatureInvalid(
            f"{SIGNATURE_NAME} of {where} is not a signature openssl writes (64 bytes for "
            "Ed25519, DER for ECDSA P-256): sign the release again as docs/signatures.md shows "
            f"and publish it again (trusted keys: {names})",
            details={"keys": [key.name for key in keys]},
        )
    raise SignatureInvalid(
        f"{SIGNATURE_NAME} of {where} does not verify with any key of the keyring (trusted "
        f"keys: {names}): either SHA256SUMS changed after it was signed, or it was signed for "
        "another model or release (a signature names both: a signed release copied under "
        "another name does not verify), or it was signed with a key the keyring does not "
        "hold. Sign this release's statement with a key of the keyring and publish both "
        f"again: {sign_again or 'see docs/signatures.md'}",
        details={"keys": [key.name for key in keys]},
    )


def missing(where: str) -> SignatureMissing:
    return SignatureMissing(
        f"{where} has no {SIGNATURE_NAME} and a signature is required (store.require_signature "
        f"or the model's require_signature): sign the release as docs/signatures.md shows, "
        f"upload {SIGNATURE_NAME}, then upload SHA256SUMS again (it stays the commit marker)"
    )


def keyring_unreadable(where: str, why: str) -> SignatureInvalid:
    """A keyring that cannot be read trusts nothing: every signature is refused until it can."""
    return SignatureInvalid(
        f"the keyring cannot be read ({where}: {why}), so no signature can be trusted; fix "
        "store.keyring or the file, then deploy again",
        details={"keyring": where},
    )
