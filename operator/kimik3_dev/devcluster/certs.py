"""Serving certificates for loopback components, signed by the dev cluster's CA.

The CA is the one ``ControlPlane`` writes (``<state>/pki/ca.crt`` + ``ca.key``, EC P-256), so
the API server and our own health checks verify every component (webhooks, controller-manager,
scheduler) against one trust root. Built with ``cryptography``; ``controlplane.py`` makes the CA and the
API server's certificate with ``new_ca`` and ``new_server_cert``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["issue_serving_cert", "new_ca", "new_server_cert", "write_private", "write_private_key"]

VALIDITY_DAYS = 30
"""Lifetime of an issued certificate, days (a dev cluster is short-lived)."""
LOOPBACK_SANS = ("localhost", "127.0.0.1", "::1")


def _builder(common_name: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey,
             days: int) -> x509.CertificateBuilder:
    """A certificate for ``common_name`` valid from 5 minutes ago (clock skew) for ``days`` days."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False))


def _key_usage(signs_certificates: bool) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, key_cert_sign=signs_certificates,
                         crl_sign=signs_certificates, encipher_only=False, decipher_only=False)


def new_ca(common_name: str, days: int = VALIDITY_DAYS) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA (EC P-256) that signs server certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (_builder(common_name, name, key.public_key(), days)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(signs_certificates=True), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def new_server_cert(common_name: str, names: tuple[str, ...], ca_cert: x509.Certificate,
                    ca_key: ec.EllipticCurvePrivateKey,
                    days: int = VALIDITY_DAYS) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A server certificate (EC P-256) for ``names`` (DNS names and IP addresses) signed by the CA."""
    sans: list[x509.GeneralName] = []
    for name in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (_builder(common_name, ca_cert.subject, key.public_key(), days)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(signs_certificates=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, key


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``, readable by its owner only (keys, tokens, kubeconfigs)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def write_private_key(path: Path, key: PrivateKeyTypes) -> None:
    """``key`` as unencrypted PKCS#8 PEM, readable by its owner only."""
    write_private(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))


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
    cert, key = new_server_cert(common_name, LOOPBACK_SANS, ca_cert, ca_key)
    out_dir.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = out_dir / cert_name, out_dir / key_name
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    write_private_key(key_path, key)
    return cert_path, key_path
