"""TLS between centers: real daemons, real TCP on loopback, real
Redis, certificates made by ``dedupnet certs``' own code (dedupnet/adapters/net/tls.py)."""

import contextlib
import functools
import ssl

import pytest
import trio
from cryptography import x509

from center_host.daemon import CenterDaemon, CenterSettings, PeerAddress
from dedupnet import cli
from dedupnet.codec.auth import keyring_from
from dedupnet.harness.cluster import center_ip, lan, open_cluster
from dedupnet.codec.messages import Error, Register
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.harness.report import SimConfig, format_report
from dedupnet.harness.sim import simulate
from dedupnet.adapters.storage.store import Store
from dedupnet.adapters.net.tls import (
    ServerTLS, TLSConfig, TLSRefused, center_uri, client_context, host_uri, make_certs, server_context,
)
from dedupnet.adapters.net.transport import ConnectionClosed, connect, serve

from .helpers import until


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """One deployment's CA with centers 1-3 and a host; and a second, unrelated CA."""
    good = tmp_path_factory.mktemp("certs")
    make_certs(good, [1, 2, 3], [(1, "127.0.1.10")], days=2)
    other = tmp_path_factory.mktemp("other-ca")
    make_certs(other, [1, 2], days=2)
    return good, other


def center_tls(directory, n, *, cert_of=None, lan_tls=False):
    """Center ``n``'s TLS files; ``cert_of``: present that network's certificate instead."""
    m = cert_of or n
    return TLSConfig(str(directory / "ca.pem"), str(directory / f"center-{m}.pem"), str(directory / f"center-{m}-key.pem"),
                     lan_tls)


def sans(path):
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return ext.get_values_for_type(x509.UniformResourceIdentifier), [str(a) for a in ext.get_values_for_type(x509.IPAddress)]


# --- certificates and the policy (no I/O) ----------------------------------------------


def test_certificates_name_their_network_id(certs):
    good, _ = certs
    assert sans(good / "center-2.pem") == (["dedupnet://network/2"], [])
    assert sans(good / "host-127.0.1.10.pem") == (["dedupnet://network/1/host/127.0.1.10"], ["127.0.1.10"])
    assert (good / "center-2-key.pem").stat().st_mode & 0o077 == 0  # keys are the owner's only
    # Both contexts load them (the CA verifies its own certificates).
    server_context(center_tls(good, 1))
    client_context(TLSConfig(str(good / "ca.pem"), lan_tls=True))


def test_policy_refuses_plain_centers_wrong_networks_and_missing_certificates():
    policy = ServerTLS(ssl.create_default_context(), network=1)
    net2 = {"subjectAltName": (("URI", center_uri(2)),)}
    assert policy.check(True, net2, "center", 2, "127.0.2.1") is None
    assert policy.check(False, None, "center", 2, "127.0.2.1")[0] == "tls"
    assert policy.check(True, {}, "center", 2, "127.0.2.1")[0] == "tls"
    assert policy.check(True, net2, "center", 3, "127.0.3.1")[0] == "wrong-network"
    # A host's certificate never passes as its center's, nor a center's as a host's.
    host = {"subjectAltName": (("URI", host_uri(2, "127.0.2.10")),)}
    assert policy.check(True, host, "center", 2, "127.0.2.1")[0] == "wrong-network"
    assert policy.check(True, net2, "host", 1, "127.0.1.10")[0] == "wrong-network"
    # Hosts: plain unless lan_tls; a TLS host without a certificate is fine; control always.
    assert policy.check(False, None, "host", 1, "127.0.1.10") is None
    lan_policy = ServerTLS(ssl.create_default_context(), network=1, require=("center", "host"))
    assert lan_policy.check(False, None, "host", 1, "127.0.1.10")[0] == "tls"
    assert lan_policy.check(True, {}, "host", 1, "127.0.1.10") is None
    assert lan_policy.check(False, None, "control", 0, "127.0.0.1") is None


def test_settings_name_what_is_missing(certs):
    good, _ = certs
    assert TLSConfig.from_settings(None, None, None, role="center") is None
    with pytest.raises(ValueError, match="tls_ca"):
        TLSConfig.from_settings(str(good / "center-1.pem"), str(good / "center-1-key.pem"), None, role="center")
    with pytest.raises(ValueError, match="tls_cert and tls_key"):
        TLSConfig.from_settings(None, None, str(good / "ca.pem"), role="center")
    with pytest.raises(ValueError, match="no such file"):
        TLSConfig.from_settings(str(good / "nope.pem"), str(good / "center-1-key.pem"), str(good / "ca.pem"), role="center")
    assert TLSConfig.from_settings(None, None, str(good / "ca.pem"), True, role="host").lan_tls


def test_certs_command_makes_files_and_prints_the_settings(tmp_path, capsys):
    assert cli.main(["certs", "--dir", str(tmp_path), "--networks", "1-2", "--host", "2:10.2.0.10"]) == 0
    out = capsys.readouterr().out
    assert f'tls_cert = "{tmp_path}/center-1.pem"' in out and "made the CA" in out
    assert (tmp_path / "host-10.2.0.10.pem").exists()
    for n in (1, 2):  # a LAN key per network, for its center and its hosts
        assert f'lan_key_file = "{tmp_path}/lan-{n}.key"' in out
        assert (tmp_path / f"lan-{n}.key").stat().st_mode & 0o777 == 0o600
        assert keyring_from(tmp_path / f"lan-{n}.key").send_id == 1
    ca, lan_key = (tmp_path / "ca.pem").read_bytes(), (tmp_path / "lan-1.key").read_bytes()
    assert cli.main(["certs", "--dir", str(tmp_path), "--networks", "1,3"]) == 0  # a network added later
    assert "reused the CA" in capsys.readouterr().out and (tmp_path / "ca.pem").read_bytes() == ca
    assert (tmp_path / "lan-1.key").read_bytes() == lan_key  # the LAN's daemons hold it: kept
    with pytest.raises(SystemExit):
        cli.main(["certs", "--networks", "0"])


def test_daemon_flags_reach_the_settings(certs):
    from dedupnet.service.config import load_settings

    good, _ = certs
    args = cli.build_parser().parse_args(["center", "--network", "1", "--tls-cert", "c", "--tls-key", "k",
                                          "--tls-ca", "a", "--lan-tls"])
    s = load_settings(None, **{k: v for k, v in vars(args).items() if k in {"tls_cert", "tls_key", "tls_ca", "lan_tls"}})
    assert (s.tls_cert, s.tls_key, s.tls_ca, s.lan_tls) == ("c", "k", "a", True)
    assert cli.main(["center", "--network", "1", "--listen", "127.0.1.1:0", "--tls-ca", str(good / "ca.pem")]) == 2


# --- two real centers ---------------------------------------------------------------


@contextlib.asynccontextmanager
async def two_centers(redis_url, tls1, tls2):
    """Centers 1 and 2 on 127.0.1.1 / 127.0.2.1, peered (1 dials 2), each with its TLS
    settings (None: plain)."""
    stores = [Store(redis_url, f"tls-test-{id(tls1)}-{n}") for n in (1, 2)]
    try:
        async with trio.open_nursery() as nursery:
            c2 = CenterDaemon(CenterSettings(2, center_ip(2), 0, lan(2), [PeerAddress(1, center_ip(1), 0, lan(1))],
                                             tls=tls2), stores[1])
            await nursery.start(c2.run)
            c1 = CenterDaemon(CenterSettings(1, center_ip(1), 0, lan(1), [PeerAddress(2, center_ip(2), c2.port, lan(2))],
                                             tls=tls1), stores[0])
            await nursery.start(c1.run)
            yield c1, c2
            nursery.cancel_scope.cancel()
    finally:
        for s in stores:
            s.delete_prefix()
            s.close()


async def test_two_centers_peer_over_tls_with_client_certificates(redis_url, certs):
    good, _ = certs
    async with two_centers(redis_url, center_tls(good, 1), center_tls(good, 2)) as (c1, c2):
        await until(lambda: c1.core.members.peers and c2.core.members.peers)
        conn = c2.conns[next(iter(c2.conns))]
        assert conn.tls and center_uri(1) in str(conn.peer_cert)  # center 2 saw center 1's certificate
        assert c1.counters.get("tls_handshakes") == 1 and c2.counters.get("tls_handshakes") == 1
        assert c1.counters.total("handshake_failed") == c2.counters.total("handshake_failed") == 0


@pytest.mark.parametrize("case", ["wrong-network", "other-ca", "plaintext", "server-wrong-network"])
async def test_a_center_that_is_not_who_it_says_is_refused(redis_url, certs, caplog, case):
    """Center 1 dials center 2 with a certificate naming network 3, or one from another
    CA, or without TLS; or center 2 answers with network 3's certificate. Refused and
    counted every time, by the side that can tell; nobody crashes, nobody peers."""
    good, other = certs
    tls1, tls2 = center_tls(good, 1), center_tls(good, 2)
    if case == "wrong-network":
        tls1 = center_tls(good, 1, cert_of=3)
    elif case == "other-ca":
        tls1 = center_tls(other, 1)
    elif case == "plaintext":
        tls1 = None
    else:
        tls2 = center_tls(good, 2, cert_of=3)
    async with two_centers(redis_url, tls1, tls2) as (c1, c2):
        refusing, reason = {"wrong-network": (c2, "wrong-network"), "other-ca": (c2, "tls"),
                            "plaintext": (c2, "tls"), "server-wrong-network": (c1, "wrong-network")}[case]
        await until(lambda: refusing.counters.get("handshake_failed", reason=reason) >= 2)  # and it retried
        assert not c1.core.members.peers and not c2.core.members.peers
        assert c1.conns == {} and c2.conns == {}
    text = {"wrong-network": "dedupnet://network/3, not dedupnet://network/1",
            "other-ca": "TLS handshake failed", "plaintext": "role center must use TLS here",
            "server-wrong-network": "dedupnet://network/3, not dedupnet://network/2"}[case]
    assert text in caplog.text


async def test_lan_tls_refuses_a_plain_host_and_serves_tls_hosts(redis_url, certs):
    good, _ = certs
    async with open_cluster(redis_url, 1, 1, prefix="tls-lan", tls_dir=str(good), lan_tls=True) as cluster:
        center = cluster.centers[1]
        assert next(iter(cluster.hosts.values())).conn.tls
        ip = "127.0.1.50"
        register = Register(ip, 1, "host", f"{ip}:1", lan(1))
        replies = []
        with trio.fail_after(10):
            async with await connect(center_ip(1), center.port, register, local_ip=ip, counters=Counters()) as conn:
                with pytest.raises(ConnectionClosed):
                    while True:
                        replies.append(await conn.receive())
        assert any(isinstance(m, Error) and m.reason == "tls" for m in replies)
        assert center.counters.get("handshake_failed", reason="tls") == 1
        # A host with TLS whose center shows a certificate of another network: refused by the host.
        counters = Counters()
        with pytest.raises(TLSRefused, match="wrong|network"):
            await connect(center_ip(1), center.port, register, local_ip=ip, counters=counters,
                          tls_context=client_context(TLSConfig(str(good / "ca.pem"), lan_tls=True)),
                          expect_uri=center_uri(2))
        assert counters.get("handshake_failed", reason="wrong-network") == 1
        # Under TLS the sender is still the socket's address (gap 2): a valid certificate
        # does not let a Register name another IP.
        liar = Register("127.0.2.99", 2, "center", "127.0.2.99:1", lan(2))
        replies = []
        with trio.fail_after(10):
            async with await connect(center_ip(1), center.port, liar, local_ip=center_ip(2), counters=Counters(),
                                     tls_context=client_context(center_tls(good, 2)),
                                     expect_uri=center_uri(1)) as conn:
                assert conn.tls
                with pytest.raises(ConnectionClosed):
                    while True:
                        replies.append(await conn.receive())
        assert any(isinstance(m, Error) and m.reason == "source-mismatch" for m in replies)
        assert center.counters.get("handshake_failed", reason="source-mismatch") == 1
        assert len(center.core.members.hosts) == 1 and not center.core.members.peers


@pytest.mark.parametrize("case", ["tls-and-key", "tls-no-key", "tls-wrong-key", "key-no-tls"])
async def test_one_connection_with_tls_and_hmac_keys(certs, case):
    """Both halves of securing a link on one connection (the merge): a center serving with
    TLS and a keyring takes a peer that has both, and refuses one that lacks either,
    counted by the half that caught it."""
    from dedupnet.codec.auth import Keyring
    from dedupnet.codec.messages import Heartbeat
    from dedupnet.codec.wire import encode

    good, _ = certs
    key, wrong = Keyring.single(bytes(range(32))), Keyring.single(bytes(range(100, 132)))
    server_counters, seen = Counters(), []

    async def handler(conn):
        seen.append((conn.tls, conn.keyring))
        conn.send_nowait(encode(Heartbeat(center_ip(1), 1.0)))
        await conn.receive()  # until the client closes

    register = Register(center_ip(2), 2, "center", f"{center_ip(2)}:1", lan(2))
    use_tls = case != "key-no-tls"
    client_key = {"tls-and-key": key, "tls-no-key": None, "tls-wrong-key": wrong, "key-no-tls": key}[case]
    async with trio.open_nursery() as nursery:
        port = await nursery.start(functools.partial(
            serve, counters=server_counters, accept_roles=("center",), keyrings={"center": key},
            tls=ServerTLS(server_context(center_tls(good, 1)), 1)), center_ip(1), 0, handler)
        tls_options = dict(tls_context=client_context(center_tls(good, 2)), expect_uri=center_uri(1)) if use_tls else {}
        replies = []
        with trio.fail_after(10):
            async with await connect(center_ip(1), port, register, local_ip=center_ip(2), counters=Counters(),
                                     keyring=client_key, **tls_options) as conn:
                assert conn.tls == use_tls
                with contextlib.suppress(ConnectionClosed):
                    replies.append(await conn.receive())
        nursery.cancel_scope.cancel()
    if case == "tls-and-key":
        assert seen == [(True, key)] and isinstance(replies[0], Heartbeat)
        assert server_counters.total("handshake_failed") == 0 and server_counters.get("tls_handshakes") == 1
    else:
        assert not seen
        if case == "key-no-tls":
            assert server_counters.get("handshake_failed", reason="tls") == 1
            assert isinstance(replies[0], Error) and replies[0].reason == "tls"  # tagged: the client could read it
        else:
            assert server_counters.get("tls_handshakes") == 1
            assert server_counters.get("bad_input", reason="bad-tag") == 1


async def test_tls_handshake_has_the_handshake_deadline(certs, autojump_clock, caplog):
    """A client that starts a TLS record and stalls (slowloris) is dropped at the
    transport's handshake timeout, counted as a timeout."""
    good, _ = certs
    counters = Counters()
    policy = ServerTLS(server_context(center_tls(good, 1)), 1)

    async def never(conn):  # pragma: no cover - nobody gets this far
        raise AssertionError("handshake passed")

    async with trio.open_nursery() as nursery:
        port = await nursery.start(functools.partial(serve, counters=counters, handshake_timeout=5.0, tls=policy),
                                   "127.0.0.1", 0, never)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"\x16\x03\x01")  # the first bytes of a ClientHello, then nothing
        start = trio.current_time()
        with trio.fail_after(60):
            assert await stream.receive_some(100) == b""  # the server closed
        assert 5.0 <= trio.current_time() - start < 6.0
        assert counters.get("handshake_failed", reason="timeout") == 1
        await stream.aclose()
        nursery.cancel_scope.cancel()
    assert "no TLS handshake within 5 s" in caplog.text


# --- a whole crawl --------------------------------------------------------------------


async def test_secure_simulation_crawls_everything_once_over_tls(redis_url):
    """Two networks, two hosts each, TLS between the centers and on the LANs: the crawl
    completes, nothing fetched twice, nothing lost, sets exchanged between the networks."""
    cfg = SimConfig(networks=2, hosts=2, pages=500, sites=8, timeout=90, seeds=4, secure=True, lan_tls=True)
    r = await simulate(cfg, redis_url, out=None)
    assert not r.timed_out
    assert r.lost_urls == 0 and r.duplicate_fetches == 0 and r.invariant_violations == 0
    assert r.fetched_urls == r.reachable_urls > 400
    # The networks worked together: each routed its URLs of the other's sites there (flag=1).
    assert r.frames_by_stage.get('{stage="dist",flag="1"}', 0) > 0
    assert r.tls_handshakes >= 2 * (1 + 2 * 2)  # both ends of the WAN link and of every host's link
    assert r.bytes_on_wire >= r.tls_bytes_on_wire > 0
    assert "TLS (--secure)" in format_report(r)


def test_secure_refuses_what_it_cannot_do():
    from dedupnet.harness.faults import Fault
    from dedupnet.harness.report import check_secure

    with pytest.raises(ValueError, match="link faults"):
        check_secure(SimConfig(secure=True, faults=(Fault("partition"),)))
    with pytest.raises(ValueError, match="owner"):
        check_secure(SimConfig(secure=True, mode="owner"))
    with pytest.raises(ValueError, match="--secure"):
        check_secure(SimConfig(lan_tls=True))


def test_processes_give_every_daemon_its_tls_flags(tmp_path):
    """--secure with --processes: each center gets its own network's certificate, hosts
    (with --lan-tls) the CA, and every command line parses with the real CLI."""
    from dedupnet.harness.procplan import plan_daemons

    cfg = SimConfig(networks=2, hosts=1, secure=True, lan_tls=True)
    centers, hosts = plan_daemons(cfg, "redis://127.0.0.1:1", "p", tmp_path, {1: 7001, 2: 7002},
                                  tls_dir=tmp_path / "certs")
    for d in centers + hosts:
        args = cli.build_parser().parse_args(d.argv[d.argv.index(d.role if d.role == "center" else "local"):])
        assert args.tls_ca == str(tmp_path / "certs" / "ca.pem") and args.lan_tls
        if d.role == "center":
            assert args.tls_cert == str(tmp_path / "certs" / f"center-{d.network}.pem")
            assert args.tls_key == str(tmp_path / "certs" / f"center-{d.network}-key.pem")
        else:
            assert args.tls_cert is None
    plain, _ = plan_daemons(SimConfig(networks=2, hosts=1), "redis://127.0.0.1:1", "p", tmp_path, {1: 7001, 2: 7002})
    assert not any(a.startswith(("--tls", "--lan-key")) for d in plain for a in d.argv)
    assert not any(d.keyring for d in plain)


def test_processes_give_every_daemon_the_lan_key_file(tmp_path):
    """--secure (and --lan-key) with --processes: every center and host gets the run's
    LAN key file, and the harness tags its status requests with the same key."""
    from dedupnet.codec.auth import new_key_line, write_key_file
    from dedupnet.harness.procplan import plan_daemons

    key_file = tmp_path / "lan.keys"
    write_key_file(key_file, [new_key_line(1)])
    centers, hosts = plan_daemons(SimConfig(networks=2, hosts=2, secure=True), "redis://127.0.0.1:1", "p", tmp_path,
                                  {1: 7001, 2: 7002}, tls_dir=tmp_path / "certs", key_file=key_file)
    assert len(centers + hosts) == 6
    for d in centers + hosts:
        args = cli.build_parser().parse_args(d.argv[d.argv.index(d.role if d.role == "center" else "local"):])
        assert args.lan_key_file == str(key_file)
        assert d.keyring is not None and d.keyring.path is not None


async def test_secure_simulation_with_every_daemon_its_own_process(redis_url):
    from dedupnet.harness.simproc import simulate_processes

    cfg = SimConfig(networks=2, hosts=1, pages=200, sites=4, timeout=90, seeds=2, secure=True)
    r = await simulate_processes(cfg, redis_url, out=None)
    assert not r.timed_out and r.lost_urls == 0 and r.duplicate_fetches == 0
    assert r.tls_handshakes >= 2 and r.tls_bytes_on_wire > r.tls_payload_bytes > 0  # the WAN link, both ends
    # The LAN key (--secure): the daemons required it of each other and of the harness's
    # status requests, or the run would not have completed.
    assert "HMAC-SHA256 tagged" in format_report(r)
