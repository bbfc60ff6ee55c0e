"""Serving certificates for loopback components, signed by the dev cluster's CA.

The CA is the one ``ControlPlane`` writes (``<state>/pki/ca.crt`` + ``ca.key``, EC P-256), so
the API server and our own health checks verify every component (webhooks, controller-manager,
scheduler) against one trust root. Built with ``cryptography``, as ``controlplane.py`` does.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["issue_serving_cert"]

VALIDITY_DAYS = 30
"""Lifetime of an issued certificate, days (a dev cluster is short-lived)."""


def issue_serving_cert(pki_dir: Path, out_dir: Path, common_name: str,
                       cert_name: str = "tls.crt", key_name: str = "tls.key") -> tuple[Path, Path]:
    """Write ``out_dir/cert_name`` and ``out_dir/key_name``: a server certificate for 127.0.0.1,
    ::1 and localhost signed by ``pki_dir/ca.crt`` / ``ca.key``. Returns (cert path, key path).

    ``tls.crt`` / ``tls.key`` are the file names controller-runtime's webhook server reads from
    its ``certDir``.
    """
    ca_cert = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{pki_dir / 'ca.key'}: expected the EC key ControlPlane writes, not {type(ca_key).__name__}")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALIDITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = out_dir / cert_name, out_dir / key_name
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))
    return cert_path, key_path
