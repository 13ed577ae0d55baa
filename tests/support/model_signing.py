"""Releases signed with OpenSSF Model Signing by running its own CLI (``model_signing``, the
``model-signing`` package of the test dependencies), with EC keys and a test CA made here with
``cryptography``: what the daemon verifies is what the real tool wrote."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

MODEL_SIGNING = Path(sys.executable).with_name("model_signing")
CURVES = {"p256": ec.SECP256R1, "p384": ec.SECP384R1}


def model_signing(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run the ``model_signing`` CLI; a failure raises with its output."""
    done = subprocess.run(
        [str(MODEL_SIGNING), *map(str, args)], capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise AssertionError(f"model_signing {args[:2]} failed: {done.stdout}{done.stderr}")
    return done


def _write_private(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


@dataclass(frozen=True)
class EcKey:
    """An EC private key in a PEM file, as ``model_signing sign key`` takes it."""

    name: str
    key: ec.EllipticCurvePrivateKey
    private: Path

    def public_pem(self, dest: Path) -> Path:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(
            self.key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        return dest

    def sign(self, release_dir: Path) -> Path:
        """``model_signing sign key`` over ``release_dir``, ``model.sig`` written into it."""
        signature = release_dir / "model.sig"
        model_signing(
            "sign", "key", release_dir, "--private_key", self.private, "--signature", signature
        )
        return signature


def make_ec_key(folder: Path, name: str, curve: str = "p256") -> EcKey:
    key = ec.generate_private_key(CURVES[curve]())
    return EcKey(name, key, _write_private(key, folder / f"{name}.key"))


@dataclass(frozen=True)
class TestCa:
    """A CA (self-signed root) that issues code-signing certificates."""

    __test__ = False  # not a pytest class
    name: str
    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate
    folder: Path

    def pem(self, dest: Path) -> Path:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))
        return dest

    def issue(self, name: str, *, days: int = 30) -> SigningCertificate:
        """A P-256 key and its certificate (``CN=<name>``), issued by this CA."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.now(UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), False)
            .sign(self.key, hashes.SHA256())
        )
        private = _write_private(key, self.folder / f"{name}.key")
        cert_path = self.folder / f"{name}.crt"
        cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        return SigningCertificate(name, private, cert_path, self.pem(self.folder / "chain.pem"))


@dataclass(frozen=True)
class SigningCertificate:
    name: str
    private: Path
    certificate: Path
    chain: Path  # the CA's certificate, as the bundle carries it

    @property
    def subject(self) -> str:
        return f"CN={self.name},O=controlplane tests"

    def sign(self, release_dir: Path) -> Path:
        """``model_signing sign certificate`` over ``release_dir``."""
        signature = release_dir / "model.sig"
        model_signing(
            "sign",
            "certificate",
            release_dir,
            "--private_key",
            self.private,
            "--signing_certificate",
            self.certificate,
            "--certificate_chain",
            self.chain,
            "--signature",
            signature,
        )
        return signature


def _name(common: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "controlplane tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common),
        ]
    )


def make_ca(folder: Path, name: str) -> TestCa:
    """A new CA ``CN=<name>``, valid for a year, its files under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=1), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return TestCa(name, key, certificate, folder / name)
