"""``model.sig`` checked with ``cryptography``: its ECDSA signature, and in certificate mode the
chain from its signing certificate to a CA of the keyring.

What is checked is what ``model_signing`` 1.x checks (its verifiers were read, and the tests run
its CLI to sign): the DSSE signature with the curve's hash (SHA-256 for P-256, SHA-384 for
P-384, SHA-512 for P-521); in certificate mode, a chain of certificates each issued by the next
(an issuer must be a CA), ending at one of the keyring's CAs, all valid at the time the signing
certificate became valid (its notBefore: a release signed while its certificate was valid keeps
verifying once it expires, as with ``model_signing verify certificate``), and a signing
certificate allowed to sign (key usage ``digitalSignature`` or extended usage ``codeSigning``).
The chain is walked here rather than with the library's TLS-minded verifier: a code-signing
chain is not a web PKI one.

Imported by :class:`~controlplane.adapters.keyring.Keyring` when it is built, as
:mod:`.publisher_keys` is, so a daemon without a keyring never loads ``cryptography``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from controlplane.adapters.keyring import KeyringError
from controlplane.domain.errors import SignatureInvalid
from controlplane.domain.model_signing import ModelBundle, invalid

Certificate = x509.Certificate
MAX_CHAIN = 8  # certificates between the signing one and a CA; real chains have one or two
_HASHES: dict[int, type[hashes.HashAlgorithm]] = {
    256: hashes.SHA256,
    384: hashes.SHA384,
    521: hashes.SHA512,
}


def verifies(key: object, bundle: ModelBundle) -> bool:
    """Whether the EC ``key`` made ``bundle``'s signature (other kinds of key never do)."""
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.key_size not in _HASHES:
        return False
    algorithm = _HASHES[key.curve.key_size]()
    try:
        key.verify(bundle.signature, bundle.signed_data, ec.ECDSA(algorithm))
    except (InvalidSignature, ValueError):
        return False
    return True


def read_cas(path: Path, data: bytes) -> list[x509.Certificate]:
    """The CA certificates of one PEM file of the keyring's ``ca/`` (a file may hold a chain),
    or :class:`KeyringError` naming the file and what is wrong."""
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise KeyringError(
            f"{path} holds no PEM certificate ({exc}); ca/ takes CA certificates"
        ) from None
    for certificate in certificates:
        if not _is_ca(certificate):
            raise KeyringError(
                f"{path} holds a certificate that is no CA ({certificate.subject.rfc4514_string()}:"
                " no basicConstraints CA:TRUE); ca/ takes the CAs that issue signing "
                "certificates, and a publisher's own key goes beside it as a *.pem"
            )
    return certificates


def certificate_signer(
    bundle: ModelBundle, cas: Sequence[tuple[str, x509.Certificate]], where: str
) -> str:
    """The subject of ``bundle``'s signing certificate, once its chain leads to one of ``cas``
    (named) and the certificate made the signature; else ``signature_invalid`` saying why."""
    try:
        chain = [x509.load_der_x509_certificate(der) for der in bundle.certificates]
    except ValueError as exc:
        raise invalid(where, f"carries a certificate that cannot be read ({exc})") from None
    leaf, given = chain[0], chain[1:]
    subject = leaf.subject.rfc4514_string()
    at = leaf.not_valid_before_utc
    _walk(leaf, given, cas, at, where, subject)
    if not _may_sign(leaf):
        raise invalid(
            where,
            f"is signed with the certificate {subject!r}, which may not sign (it has neither "
            "key usage digitalSignature nor extended key usage codeSigning)",
        )
    if not verifies(leaf.public_key(), bundle):
        raise invalid(
            where,
            f"does not verify with the key of its certificate {subject!r}: its statement "
            "changed after it was signed",
        )
    return subject


def _walk(
    leaf: x509.Certificate,
    given: Sequence[x509.Certificate],
    cas: Sequence[tuple[str, x509.Certificate]],
    at: datetime,
    where: str,
    subject: str,
) -> None:
    current = leaf
    for _ in range(MAX_CHAIN + 1):
        for _name, ca in cas:
            if _issued(current, ca) and _valid(ca, at):
                return
        issuer = next((c for c in given if _is_ca(c) and _issued(current, c)), None)
        if issuer is None or not _valid(issuer, at):
            break
        current = issuer
    trusted = ", ".join(name for name, _ in cas) or "none"
    raise SignatureInvalid(
        f"{where} is signed with the certificate {subject!r}, whose chain (issued by "
        f"{current.issuer.rfc4514_string()!r}) leads to no CA of the keyring's ca/ (CAs: "
        f"{trusted}), valid when the certificate was issued: add the publisher's CA "
        "certificate to the keyring's ca/ if it is to be trusted, or sign with a certificate "
        "one of them issued",
        details={"certificate": subject, "cas": [name for name, _ in cas]},
    )


def _issued(certificate: x509.Certificate, issuer: x509.Certificate) -> bool:
    if certificate.issuer != issuer.subject:
        return False
    try:
        certificate.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        return False
    return True


def _valid(certificate: x509.Certificate, at: datetime) -> bool:
    return certificate.not_valid_before_utc <= at <= certificate.not_valid_after_utc


def _is_ca(certificate: x509.Certificate) -> bool:
    try:
        constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints)
    except x509.ExtensionNotFound:
        return False
    return constraints.value.ca


def _may_sign(certificate: x509.Certificate) -> bool:
    extensions = certificate.extensions
    try:
        if extensions.get_extension_for_class(x509.KeyUsage).value.digital_signature:
            return True
    except x509.ExtensionNotFound:
        pass
    try:
        usage = extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return False
    return ExtendedKeyUsageOID.CODE_SIGNING in usage
