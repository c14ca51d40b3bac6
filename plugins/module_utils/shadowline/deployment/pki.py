"""The deployment's own certificate authority, kept on the Ansible controller (issue #13).

``ensure_pki`` creates (once) a CA for one deployment and, per host, the certificates its services present:
every host gets a client certificate (its agent, engines, frontend and the modules run there connect to etcd
and NATS with it); each infra host gets a server certificate (etcd's client and peer listeners, NATS) naming
its address and host name; the controller gets a client certificate of its own (status, drills). Keys are
EC P-256, written 0600 in directories 0700; nothing is ever returned or printed but paths. A certificate is
issued again when it is missing, when its names no longer match the host's address, when its subject names
another deployment, when the CA changed, or when it expires within 30 days. Needs the ``cryptography`` package
on the controller (ansible-core's own dependency).

Layout of ``pki_dir``: ``ca.crt``, ``ca.key``, ``hosts/<host>/{client,server,etcd-client}.{crt,key}``,
``hosts/<host>/client.pem`` (the client certificate and key in one file, for HAProxy),
``controller/{client,etcd-client}.*``, and ``jwt.{key,pub}``: the key pair etcd signs its auth tokens with.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

CA_DAYS = 3650
LEAF_DAYS = 397
RENEW_BEFORE = datetime.timedelta(days=30)
CLIENT, SERVER, ETCD_CLIENT = "client", "server", "etcd-client"
JWT_KEY, JWT_PUB = "jwt.key", "jwt.pub"  # etcd's token signing key pair (EC P-256, ES256), every member's


@dataclass(frozen=True)
class Subject:
    """One certificate to issue: who it names (``cn``; empty: an etcd client certificate, named by its
    organizational unit), for what (client, server or etcd-client), with which names."""
    directory: str  # relative to pki_dir: hosts/<host> or controller
    kind: str  # client | server | etcd-client
    cn: str
    dns: tuple[str, ...] = ()
    ips: tuple[str, ...] = ()


def subjects(deployment: str, hosts: list[tuple[str, str]], infra: list[tuple[str, str]],
             etcd_clients: bool = True) -> list[Subject]:
    """What a deployment needs: a client certificate per host (and the controller), a server one per host (etcd
    and NATS on the infra hosts, the agents' endpoint on the nodes), and an etcd client certificate per host (and
    the controller) without a common name: etcd 3.4's JSON gateway, which the agents, the modules and the
    controller's tools use, refuses a client certificate with one while authentication is on (``etcd_clients``
    False: etcd's clients are plain, as a Slurm job's, and need none)."""
    out = []
    for host, address in dict.fromkeys(hosts + infra):
        names = _names(host, address)
        out.append(Subject(f"hosts/{host}", CLIENT, common_name(deployment, host), *names))
    for host, address in dict.fromkeys(hosts + infra):
        dns, ips = _names(host, address)
        out.append(Subject(f"hosts/{host}", SERVER, common_name(deployment, host), dns, ips + ("127.0.0.1",)))
    out.append(Subject("controller", CLIENT, common_name(deployment, "controller")))
    if etcd_clients:
        out += [Subject(f"hosts/{host}", ETCD_CLIENT, "") for host, _unused in dict.fromkeys(hosts + infra)]
        out.append(Subject("controller", ETCD_CLIENT, ""))
    return out


def common_name(deployment: str, who: str) -> str:
    """The CN of a certificate of the deployment: a host's (its services') or the controller's."""
    return f"{who}.{deployment}.shadowline"


def organization(deployment: str) -> str:
    """The O of every certificate the deployment's CA issues (not of the CA itself)."""
    return f"shadowline {deployment}"


def subject_dn(deployment: str, who: str) -> str:
    """A certificate's subject as RFC 2253 writes it (the last attribute first), which is how NATS names the user
    of a client certificate with ``verify_and_map`` (nats-server 2.9, measured): ``CN=...,O=...``."""
    return f"CN={_dn_escape(common_name(deployment, who))},O={_dn_escape(organization(deployment))}"


def _dn_escape(value: str) -> str:
    """RFC 2253 escaping of an attribute value as Go's crypto/x509/pkix writes it (nats-server's side); deployment
    names and host names rarely need any."""
    out = "".join("\\" + c if c in ',+"\\<>;' else c for c in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    return out[:-1] + "\\ " if out.endswith(" ") else out


def _names(host: str, address: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    try:
        ipaddress.ip_address(address)
        return (host,), (address,)
    except ValueError:
        return tuple(dict.fromkeys((host, address))), ()


def ensure_pki(pki_dir: str, deployment: str, hosts: list[tuple[str, str]], infra: list[tuple[str, str]],
               now: datetime.datetime | None = None, etcd_clients: bool = True) -> list[str]:
    """Create or refresh the deployment's CA and certificates under ``pki_dir``; the paths written (no secret).
    ``etcd_clients``: the etcd client certificates and each host's ``client.pem`` too (etcd's clients over TLS)."""
    from cryptography import x509  # noqa: PLC0415 (controller only: hosts never import this module's code)
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: PLC0415

    now = now or datetime.datetime.now(datetime.timezone.utc)
    written: list[str] = []
    _private_dir(pki_dir)
    _private_dir(os.path.join(pki_dir, "hosts"))

    def save_key(path: str, key: ec.EllipticCurvePrivateKey) -> None:
        _write(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()), 0o600)
        written.append(path)

    def save_cert(path: str, cert: x509.Certificate) -> None:
        _write(path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
        written.append(path)

    ca_key_path, ca_cert_path = os.path.join(pki_dir, "ca.key"), os.path.join(pki_dir, "ca.crt")
    ca_name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "shadowline"),
                         x509.NameAttribute(NameOID.COMMON_NAME, f"shadowline {deployment} CA")])
    if os.path.exists(ca_key_path) and os.path.exists(ca_cert_path):
        with open(ca_key_path, "rb") as handle:
            ca_key = serialization.load_pem_private_key(handle.read(), None)
        with open(ca_cert_path, "rb") as handle:
            ca_cert = x509.load_pem_x509_certificate(handle.read())
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
                   .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
                   .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                content_commitment=False, key_encipherment=False,
                                                data_encipherment=False, key_agreement=False, encipher_only=False,
                                                decipher_only=False), critical=True)
                   .sign(ca_key, hashes.SHA256()))
        save_key(ca_key_path, ca_key)
        save_cert(ca_cert_path, ca_cert)

    written += _ensure_jwt_pair(pki_dir)
    for subject in subjects(deployment, hosts, infra, etcd_clients):
        directory = os.path.join(pki_dir, subject.directory)
        _private_dir(directory)
        cert_path = os.path.join(directory, f"{subject.kind}.crt")
        key_path = os.path.join(directory, f"{subject.kind}.key")
        sans = [x509.DNSName(d) for d in subject.dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in subject.ips]
        last = (x509.NameAttribute(NameOID.COMMON_NAME, subject.cn) if subject.cn else
                x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, os.path.basename(subject.directory)))
        name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization(deployment)), last])
        if not _current(cert_path, key_path, ca_cert, name, sans, now):
            key = ec.generate_private_key(ec.SECP256R1())
            usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
            if subject.kind == SERVER:
                usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
            builder = (x509.CertificateBuilder()
                       .subject_name(name)
                       .issuer_name(ca_cert.subject).public_key(key.public_key())
                       .serial_number(x509.random_serial_number())
                       .not_valid_before(now - datetime.timedelta(minutes=5))
                       .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
                       .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                       .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
            if sans:
                builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
            save_key(key_path, key)
            save_cert(cert_path, builder.sign(ca_key, hashes.SHA256()))
        if etcd_clients and subject.kind == CLIENT and subject.directory.startswith("hosts/"):
            written += _ensure_pem(os.path.join(directory, "client.pem"), cert_path, key_path)
    return written


def _ensure_jwt_pair(pki_dir: str) -> list[str]:
    """etcd's token signing key pair (``--auth-token jwt``), made once: the key in SEC1 PEM ("EC PRIVATE KEY", what
    etcd 3.4's JWT library reads), its public key beside it, written again only when missing or not the key's.
    A new pair ends every token etcd handed out (a parked shadow's among them): rotate it as the CA, with a
    relaunch of the shadows after (docs/security.md)."""
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415

    key_path, pub_path = os.path.join(pki_dir, JWT_KEY), os.path.join(pki_dir, JWT_PUB)
    written = []
    if os.path.exists(key_path):
        with open(key_path, "rb") as handle:
            key = serialization.load_pem_private_key(handle.read(), None)
    else:
        key = ec.generate_private_key(ec.SECP256R1())
        _write(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                           serialization.NoEncryption()), 0o600)
        written.append(key_path)
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    if not os.path.exists(pub_path) or open(pub_path, "rb").read() != pub:  # noqa: SIM115
        _write(pub_path, pub, 0o644)
        written.append(pub_path)
    return written


def _ensure_pem(pem_path: str, cert_path: str, key_path: str) -> list[str]:
    """The certificate and its key in one file (0600), as HAProxy (a host's etcd proxy) reads them; [pem_path]
    when written."""
    with open(cert_path, "rb") as cert_file, open(key_path, "rb") as key_file:
        pem = cert_file.read() + key_file.read()
    if os.path.exists(pem_path):
        with open(pem_path, "rb") as handle:
            if handle.read() == pem:
                return []
    _write(pem_path, pem, 0o600)
    return [pem_path]


def _current(cert_path: str, key_path: str, ca_cert: object, name: object, sans: list[object],
             now: datetime.datetime) -> bool:
    """Whether the certificate at ``cert_path`` (with its key) can stay: same CA, same subject (NATS's user name:
    another deployment's certificate in a shared ``gms_secrets_dir`` is not this one's), same names, not
    expiring."""
    from cryptography import x509  # noqa: PLC0415

    if not (os.path.exists(cert_path) and os.path.exists(key_path)):
        return False
    with open(cert_path, "rb") as handle:
        cert = x509.load_pem_x509_certificate(handle.read())
    if (cert.issuer != ca_cert.subject or cert.subject != name  # type: ignore[attr-defined]
            or cert.not_valid_after_utc - RENEW_BEFORE < now):
        return False
    try:
        have = list(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        have = []
    return sorted(map(repr, have)) == sorted(map(repr, sans))


def _private_dir(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)


def _write(path: str, data: bytes, mode: int) -> None:
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
