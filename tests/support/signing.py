"""Publisher keys and signatures made by running the real ``openssl`` binary, the way
docs/signatures.md tells a publisher to make them: nothing here imports ``cryptography``, so a
signature the daemon accepts is one plain openssl wrote."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Kind = Literal["ed25519", "p256", "p384"]
OPENSSL = shutil.which("openssl") or "openssl"


def openssl(*args: str | Path) -> None:
    subprocess.run([OPENSSL, *map(str, args)], check=True, capture_output=True, timeout=30)


@dataclass(frozen=True)
class PublisherKey:
    name: str
    kind: Kind
    private: Path

    def public_pem(self, dest: Path) -> Path:
        """Write the public part to ``dest`` (``openssl pkey -pubout``)."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        openssl("pkey", "-in", self.private, "-pubout", "-out", dest)
        return dest

    def certificate(self, dest: Path, *, days: int) -> Path:
        """A self-signed certificate of the key, valid from now for ``days`` (a negative
        number: its notAfter is that many days in the past, so it is expired)."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        csr = dest.with_suffix(".csr")
        openssl("req", "-new", "-key", self.private, "-subj", f"/CN={self.name}", "-out", csr)
        openssl("x509", "-req", "-in", csr, "-key", self.private, "-days", str(days), "-out", dest)
        csr.unlink()
        return dest

    def sign(self, sums: Path, model: str, release: str, out: Path | None = None) -> Path:
        """Sign ``release`` of ``model`` whose ``SHA256SUMS`` is the file ``sums``, as the
        docs' commands do: the statement naming them, then the file's bytes, written outside
        the release and signed. The signature goes to ``out`` (default: ``<sums>.sig``)."""
        header = f"controlplane-release v1\nmodel {model}\nrelease {release}\n".encode()
        with tempfile.TemporaryDirectory() as work:
            signed = Path(work) / "statement"
            signed.write_bytes(header + sums.read_bytes())
            return self.sign_bytes_of(signed, out or sums.with_name(sums.name + ".sig"))

    def sign_unbound(self, sums: Path, out: Path | None = None) -> Path:
        """Sign the bytes of ``sums`` alone, the old way (before a signature named its model
        and release)."""
        return self.sign_bytes_of(sums, out or sums.with_name(sums.name + ".sig"))

    def sign_bytes_of(self, data: Path, out: Path) -> Path:
        if self.kind == "ed25519":
            openssl("pkeyutl", "-sign", "-inkey", self.private, "-rawin", "-in", data, "-out", out)
        else:
            openssl("dgst", "-sha256", "-sign", self.private, "-out", out, data)
        return out


def make_key(folder: Path, name: str, kind: Kind = "ed25519") -> PublisherKey:
    """A new private key ``<folder>/<name>.key`` (``openssl genpkey``)."""
    folder.mkdir(parents=True, exist_ok=True)
    private = folder / f"{name}.key"
    if kind == "ed25519":
        openssl("genpkey", "-algorithm", "ed25519", "-out", private)
    else:
        curve = "P-256" if kind == "p256" else "P-384"
        openssl(
            "genpkey", "-algorithm", "EC", "-pkeyopt", f"ec_paramgen_curve:{curve}", "-out", private
        )
    return PublisherKey(name, kind, private)
