"""TLS between centers (and optionally on a LAN): contexts, who a certificate names, the
byte count under TLS, and ``dedupnet certs``.

Why
---

The paper trusts a connection by where it comes from (§2.1: a frame carries its IP;
docs/PROTOCOL.md gap 2: dedupnet checks that IP against the TCP source address). That
is enough on one LAN, not between networks that talk across the internet: anyone on a
permitted address could answer a flag=2 request with a flag=3 frame that marks URLs as
seen (§2.4), and they would never be crawled. So a center that is given a certificate,
its key and the deployment's CA (``tls_cert``, ``tls_key``, ``tls_ca``) speaks TLS to
the other centers, in both directions, with certificates on both ends:

* **Who a certificate names.** A certificate names a *network id*, not a host name:
  its subjectAltName holds the URI ``dedupnet://network/<N>`` (a center) or
  ``dedupnet://network/<N>/host/<IP>`` (a host, optional: only with ``lan_tls``). The
  common name (``dedupnet center of network N``) is for people; only the URI is
  checked. A URI SAN cannot be mistaken for a DNS name, so a certificate of this CA can
  never pass as a web server's, and a host's certificate never as its center's.
* **Both ends check the other.** The center that dials a peer (the lower network id,
  center_host/daemon.py) checks that the peer's certificate names the network it
  dialed; the accepting center checks that the dialer's certificate names the network
  of its Register, which must be a configured peer. Host names are not checked
  (``check_hostname`` off): centers are configured by address, often behind NAT.
* **One port.** Hosts, peers and ``dedupnet status`` share a center's port. The first
  byte tells TLS (a handshake record, 0x16) from plain dedupnet (the magic ``DN``); it
  is peeked, not read (:func:`sniff_tls`). A plain connection is then refused if its
  role must use TLS: ``center`` always, ``host`` with ``lan_tls``. ``control`` (the
  read-only status) is served either way.
* **Failures are counted, not fatal.** A handshake that fails (wrong CA, no client
  certificate, not TLS at all, too slow) is ``handshake_failed{reason="tls"}`` (or
  ``"timeout"``); a certificate for another network is ``"wrong-network"``. Each is
  logged with the reason, costs that connection only, and a dialing center retries with
  back-off (dedupnet/adapters/net/transport/client.py ``connect_forever``).

The sans-I/O part (contexts, certificate names, the policy) is plain functions; the
trio part (handshake under a deadline, the counting stream) is small and lives here
so that :mod:`dedupnet.adapters.net.transport` only calls it.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import logging
import os
import socket
import ssl
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from dedupnet.codec.auth import new_key_line, write_key_file
from dedupnet.codec.settings import positive_int
from dedupnet.codec.errors import SettingsError

log = logging.getLogger("dedupnet.adapters.net.tls")

__all__ = [
    "TLSConfig", "TLSRefused", "ServerTLS", "CountingStream", "center_uri", "host_uri", "cert_uris",
    "server_context", "client_context", "sniff_tls", "make_certs", "certs_main",
]

URI_PREFIX = "dedupnet://network/"
TLS_HANDSHAKE_RECORD = 0x16  # the first byte of every TLS ClientHello (a handshake record)


def center_uri(network: int) -> str:
    """The subjectAltName URI of network ``network``'s center certificate."""
    return f"{URI_PREFIX}{int(network)}"


def host_uri(network: int, ip: str) -> str:
    """The subjectAltName URI of a host certificate (``lan_tls`` with host certificates)."""
    return f"{URI_PREFIX}{int(network)}/host/{ipaddress.ip_address(ip)}"


def cert_uris(cert: dict | None) -> list[str]:
    """The URI subjectAltNames of a peer certificate as :meth:`ssl.SSLSocket.getpeercert`
    gives it (an empty dict or None: no certificate)."""
    return [value for kind, value in (cert or {}).get("subjectAltName", ()) if kind == "URI"]


@dataclass(frozen=True)
class TLSConfig:
    """A daemon's TLS files (settings ``tls_cert``, ``tls_key``, ``tls_ca``, ``lan_tls``).

    A center with ``cert``, ``key`` and ``ca`` requires TLS of its peers; with
    ``lan_tls`` of its hosts too. A host with ``lan_tls`` (and ``ca``) speaks TLS to its
    center and checks that the center's certificate names its network; its own
    ``cert``/``key`` are optional (presented if given)."""

    ca: str
    cert: str | None = None
    key: str | None = None
    lan_tls: bool = False

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("tls_cert and tls_key go together: give both or neither")
        for name in ("ca", "cert", "key"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"tls_{name} {path!r}: no such file")
        self._check_files()

    def _check_files(self) -> None:
        """Read the files now, so a wrong one stops the daemon at start with its name
        rather than failing every handshake later."""
        try:
            ssl.create_default_context(cafile=self.ca)
        except ssl.SSLError as exc:
            raise SettingsError(f"tls_ca {self.ca}: not a PEM CA certificate ({exc.reason or exc})") from None
        if self.cert is None:
            return
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(self.cert, self.key)
        except ssl.SSLError as exc:
            if exc.reason == "KEY_VALUES_MISMATCH":
                raise SettingsError(f"tls_cert {self.cert} and tls_key {self.key} do not match: the key is not "
                                    "the certificate's") from None
            raise SettingsError(f"tls_cert {self.cert} and tls_key {self.key}: not a PEM certificate and its "
                                f"key ({exc.reason or exc})") from None

    def check_names(self, role: str, network: int, ip: str | None = None) -> None:
        """The certificate must name this daemon's network (a host's, its network and
        IP): its peers would refuse every handshake with ``wrong-network``, which no
        retry cures, so say so at start, naming the file."""
        if self.cert is None:
            return
        x509 = _x509()[0]
        try:
            cert = x509.load_pem_x509_certificate(Path(self.cert).read_bytes())
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            uris = san.get_values_for_type(x509.UniformResourceIdentifier)
        except x509.ExtensionNotFound:
            uris = []
        except ValueError as exc:
            raise SettingsError(f"tls_cert {self.cert}: not a PEM certificate ({exc})") from None
        want = center_uri(network) if role == "center" else host_uri(network, ip) if ip else None
        if want is None or want in uris:
            return
        names = ", ".join(u for u in uris if u.startswith(URI_PREFIX)) or "no dedupnet network"
        raise SettingsError(f"tls_cert {self.cert} names {names}, not {want}: it is another "
                            f"{'network' if role == 'center' else 'host'}'s certificate (check --network, "
                            f"{'--ip, ' if role != 'center' else ''}--tls-cert)", reason="wrong-network")

    @classmethod
    def from_settings(cls, tls_cert: str | None, tls_key: str | None, tls_ca: str | None,
                      lan_tls: bool = False, *, role: str) -> "TLSConfig | None":
        """None when TLS is off (nothing given); ValueError naming what is missing."""
        if tls_cert is None and tls_key is None and tls_ca is None:
            if lan_tls:
                raise ValueError("lan_tls needs tls_ca (and, on a center, tls_cert and tls_key)")
            return None
        if tls_ca is None:
            raise ValueError("TLS needs tls_ca: the deployment's CA certificate (dedupnet certs makes one)")
        if role == "center" and (tls_cert is None or tls_key is None):
            raise ValueError("a center with TLS needs tls_cert and tls_key (its own certificate and key)")
        return cls(tls_ca, tls_cert, tls_key, lan_tls)


def server_context(config: TLSConfig) -> ssl.SSLContext:
    """A center's listening side: presents its certificate; a client certificate is
    verified against the CA if one is sent (CERT_OPTIONAL: hosts with ``lan_tls`` may
    have none), and :meth:`ServerTLS.check` requires one of every center."""
    if config.cert is None or config.key is None:
        raise ValueError("a TLS server needs tls_cert and tls_key")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=config.ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(config.cert, config.key)
    ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def client_context(config: TLSConfig) -> ssl.SSLContext:
    """The dialing side: verifies the server's certificate against the CA (the network
    it names is checked after the handshake, not a host name) and presents its own
    certificate if it has one."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=config.ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False  # certificates name network ids (URI SANs), checked by expect_uri
    ctx.verify_mode = ssl.CERT_REQUIRED
    if config.cert is not None and config.key is not None:
        ctx.load_cert_chain(config.cert, config.key)
    return ctx


class TLSRefused(ConnectionError):
    """The TLS handshake failed, or the other side's certificate names someone else.
    ``reason`` is the counter label: ``tls`` or ``wrong-network``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def expected_uri_problem(cert: dict | None, want: str) -> str | None:
    """None if ``cert`` names ``want``; otherwise what it names instead (for the log)."""
    uris = cert_uris(cert)
    if want in uris:
        return None
    if not cert:
        return "no certificate"
    return f"the certificate names {', '.join(uris) or 'no dedupnet network'}, not {want}"


@dataclass(frozen=True)
class ServerTLS:
    """What :func:`dedupnet.adapters.net.transport.serve` needs for TLS: the context, which roles
    must use it, and the network of this center (a host's certificate, if any, must be
    of this network)."""

    context: ssl.SSLContext
    network: int
    require: tuple[str, ...] = ("center",)

    def check(self, tls: bool, cert: dict | None, role: str, network: int, ip: str) -> tuple[str, str] | None:
        """``(reason, text)`` to refuse a registered connection, or None to accept it.
        ``tls``: the connection is TLS; ``cert``: the client's verified certificate."""
        if role in self.require and not tls:
            return "tls", f"role {role} must use TLS here (the connection is plain)"
        if not tls:
            return None
        if role == "center":
            problem = expected_uri_problem(cert, center_uri(network))
            if problem == "no certificate":
                return "tls", "a center must present a client certificate"
            if problem is not None:
                return "wrong-network", f"registered as network {network}, but {problem}"
        elif role == "host" and cert:
            problem = expected_uri_problem(cert, host_uri(self.network, ip))
            if problem is not None:
                return "wrong-network", f"host {ip} of network {self.network}, but {problem}"
        return None


# --- trio: the first byte, the stream under TLS ----------------------------------------


async def sniff_tls(sock: Any) -> bool | None:
    """Whether the peer starts with a TLS handshake record: True, False, or None if it
    closed first. Peeks (MSG_PEEK): the byte stays for whoever reads next. No deadline
    of its own: the caller's handshake deadline covers it."""
    data = await sock.recv(1, socket.MSG_PEEK)
    if not data:
        return None
    return data[0] == TLS_HANDSHAKE_RECORD


class CountingStream(trio.abc.HalfCloseableStream):
    """The TCP stream under an :class:`trio.SSLStream`, counting every byte it carries
    (TLS records, handshakes and alerts included) as ``tls_sent_bytes`` /
    ``tls_received_bytes``: what the encryption costs on the wire, next to the
    messages' own ``sent_bytes``."""

    def __init__(self, stream: trio.SocketStream, counters) -> None:
        self.transport_stream = stream
        self.socket = stream.socket
        self.counters = counters

    async def send_all(self, data) -> None:
        await self.transport_stream.send_all(data)
        self.counters.inc("tls_sent_bytes", len(data))

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport_stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self.transport_stream.receive_some(max_bytes)
        if data:
            self.counters.inc("tls_received_bytes", len(data))
        return data

    async def send_eof(self) -> None:
        await self.transport_stream.send_eof()

    async def aclose(self) -> None:
        await self.transport_stream.aclose()


def wrap(stream: trio.SocketStream, context: ssl.SSLContext, counters, *, server_side: bool) -> trio.SSLStream:
    return trio.SSLStream(CountingStream(stream, counters), context, server_side=server_side)


def ssl_error_text(exc: BaseException) -> str:
    """The SSL reason behind a trio.BrokenResourceError from a handshake."""
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, ssl.SSLError):
        return cause.reason or str(cause)
    return str(cause or exc)


# --- dedupnet certs -------------------------------------------------------------------


def _x509():
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as e:  # pragma: no cover - a dependency of the project
        raise RuntimeError("dedupnet certs needs the 'cryptography' package (pip install cryptography)") from e
    return x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID


def _write_key(path: Path, key) -> None:
    _, _, serialization, _, _, _ = _x509()
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_cert(path: Path, cert) -> None:
    _, _, serialization, _, _, _ = _x509()
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _load_or_make_ca(directory: Path, days: int, name: str):
    x509, hashes, serialization, ec, _, NameOID = _x509()
    cert_path, key_path = directory / "ca.pem", directory / "ca-key.pem"
    if cert_path.exists() and key_path.exists():
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        return x509.load_pem_x509_certificate(cert_path.read_bytes()), key, False
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
    return cert, key, True


def _issue(ca_cert, ca_key, common_name: str, uri: str, ips: Sequence[str], days: int):
    x509, hashes, _, ec, ExtendedKeyUsageOID, NameOID = _x509()
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    names = [x509.UniformResourceIdentifier(uri)] + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        # Both: a center serves its hosts and peers and dials its peers with one certificate.
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


@dataclass
class Made:
    """What :func:`make_certs` wrote: the CA's files and each certificate's (cert, key)."""

    ca: Path
    ca_key: Path
    ca_created: bool
    centers: dict[int, tuple[Path, Path]]
    hosts: dict[str, tuple[Path, Path]]
    #: network -> its LAN key file (dedupnet/codec/auth.py), shared by its center and hosts.
    lan_keys: dict[int, Path] = field(default_factory=dict)
    #: host IP -> its network
    host_networks: dict[str, int] = field(default_factory=dict)


def make_certs(directory: str | Path, networks: Sequence[int], hosts: Sequence[tuple[int, str]] = (), *,
               days: int = 825, ca_name: str = "dedupnet deployment CA",
               center_ips: dict[int, Sequence[str]] | None = None) -> Made:
    """A small CA (``ca.pem``, ``ca-key.pem``; reused if the directory has one) and one
    certificate and key per network's center (``center-<N>.pem``, ``center-<N>-key.pem``)
    and per host given as ``(network, ip)`` (``host-<ip>.pem``, ``host-<ip>-key.pem``).
    Keys are EC P-256 (small, fast handshakes), written mode 0600. Also a LAN key file per
    network (``lan-<N>.key``, 0600, kept if there is one: the LAN's daemons hold it)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key, created = _load_or_make_ca(out, days, ca_name)
    made = Made(out / "ca.pem", out / "ca-key.pem", created, {}, {})
    for n in networks:
        cert, key = _issue(ca_cert, ca_key, f"dedupnet center of network {n}", center_uri(n),
                           (center_ips or {}).get(n, ()), days)
        paths = (out / f"center-{n}.pem", out / f"center-{n}-key.pem")
        _write_cert(paths[0], cert)
        _write_key(paths[1], key)
        made.centers[n] = paths
    for n in dict.fromkeys([*networks, *(n for n, _ in hosts)]):
        lan_key = out / f"lan-{n}.key"
        if not lan_key.exists():
            write_key_file(lan_key, [new_key_line()])
        made.lan_keys[n] = lan_key
    for n, ip in hosts:
        cert, key = _issue(ca_cert, ca_key, f"dedupnet host {ip} of network {n}", host_uri(n, ip), (ip,), days)
        paths = (out / f"host-{ip}.pem", out / f"host-{ip}-key.pem")
        _write_cert(paths[0], cert)
        _write_key(paths[1], key)
        made.hosts[ip] = paths
        made.host_networks[ip] = n
    return made


def _networks_arg(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        lo, _, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected network ids like 1,2,3 or 1-3, got {text!r}") from None
        if not 1 <= first <= last <= 65535:
            raise argparse.ArgumentTypeError(f"network ids are 1..65535, got {part!r}")
        out += range(first, last + 1)
    return out


def _host_arg(text: str) -> tuple[int, str]:
    network, sep, ip = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return int(network), str(ipaddress.ip_address(ip))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--host wants NETWORK:IP, e.g. 1:10.1.0.10, got {text!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default="dedupnet-certs", metavar="DIR",
                   help="where to write the files (default dedupnet-certs/); a CA already there is reused")
    p.add_argument("--networks", type=_networks_arg, required=True, metavar="IDS",
                   help="network ids to make center certificates for: 1,2,3 or 1-3")
    p.add_argument("--host", dest="hosts", action="append", type=_host_arg, default=[], metavar="NET:IP",
                   help="also a certificate for this host (repeat; optional: hosts need only the CA for lan_tls)")
    p.add_argument("--days", type=positive_int, default=825, metavar="N", help="validity in days (default 825)")


def certs_main(args: argparse.Namespace, out=None) -> int:
    out = out or sys.stdout
    made = make_certs(args.dir, args.networks, args.hosts, days=args.days)
    d = Path(args.dir)
    print(f"{'made' if made.ca_created else 'reused'} the CA: {made.ca} (its key {made.ca_key}: keep it "
          f"off the daemons' machines; it is only needed to make more certificates)", file=out)
    for n, (cert, key) in made.centers.items():
        lan_key = made.lan_keys[n]
        print(f"\n# center of network {n} (certificate names {center_uri(n)}): in its dedupnet.toml", file=out)
        print(f'tls_cert = "{cert}"\ntls_key = "{key}"\ntls_ca = "{d / "ca.pem"}"\nlan_key_file = "{lan_key}"',
              file=out)
        print("# lan_tls = true   # also require TLS of this LAN's hosts", file=out)
        print(f"# or: dedupnet center --tls-cert {cert} --tls-key {key} --tls-ca {d / 'ca.pem'} "
              f"--lan-key-file {lan_key} ...", file=out)
    for ip, (cert, key) in made.hosts.items():
        print(f"\n# host {ip}: in its dedupnet.toml", file=out)
        print(f'lan_key_file = "{made.lan_keys[made.host_networks[ip]]}"\n'
              f'lan_tls = true\ntls_ca = "{d / "ca.pem"}"\ntls_cert = "{cert}"\ntls_key = "{key}"', file=out)
    for n, lan_key in made.lan_keys.items():
        print(f"\n# any host of network {n} (a copy of its LAN key; no certificate of its own needed):\n"
              f'lan_key_file = "{lan_key}"\n# lan_tls = true   # with a center that has lan_tls\n'
              f'# tls_ca = "{d / "ca.pem"}"', file=out)
    return 0
