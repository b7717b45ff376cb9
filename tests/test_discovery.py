"""LAN discovery (dedupnet/adapters/net/discovery.py): a host started with
``--center auto`` finds its center by a UDP broadcast, authenticated under a LAN key.

The codec and the two decision makers are tested without sockets; the trio adapters
with real UDP on loopback, broadcast to 127.255.255.255 (every 127.x address is local on
Linux, and the kernel has that broadcast route on lo), timeouts on trio's MockClock;
``dedupnet local --center auto`` as a real process against a real center; and, in
network namespaces (skipped where they cannot be built), a host that finds a center in
another namespace across a bridge by a real broadcast on its interface's broadcast
address. No test broadcasts anywhere else: every search is given its address.
"""

from __future__ import annotations

import logging
import random
import signal
import socket
import struct
import subprocess
from pathlib import Path

import orjson
import pytest
import trio

from center_host.daemon import CenterDaemon, CenterSettings
from dedupnet.adapters.net import discovery as d
from dedupnet.adapters.net import netinfo
from dedupnet.codec import wire
from dedupnet.codec.auth import Keyring, new_key_line, write_key_file
from dedupnet.cli import build_parser, main
from dedupnet.service.config import load_settings
from dedupnet.codec.errors import DiscoveryError, ProtocolError
from dedupnet.codec.messages import Heartbeat
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.storage.store import Store
from local_host.pools import HostPools

from . import netns
from .helpers import DEDUPNET
from .netns import in_netns
from .netns_lab import Daemon, stop

ROOT = Path(__file__).resolve().parent.parent
KEY = Keyring.single(b"k" * 32)
OTHER_KEY = Keyring.single(b"o" * 32, key_id=1)  # same key id, another secret: a forger's guess
LAN = "127.0.1.0/24"
CENTER = "127.0.1.1:7700"
HOST_IP = "127.0.1.10"
LOOPBACK_BROADCAST = "127.255.255.255"
NONCE = "0123456789abcdef" * 2


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


async def listener(port: int):
    """A UDP socket on the discovery port beside any center there (SO_REUSEADDR, as the
    responder sets it: every one of them gets each broadcast)."""
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    await sock.bind(("0.0.0.0", port))
    return sock


def responder(keyring=None, counters=None, **kw) -> d.Responder:
    return d.Responder(1, LAN, CENTER, keyring, counters or Counters(), **kw)


def datagram(kind: int, body: bytes, *, version=1, tag_len=0, reserved=0, magic=d.MAGIC) -> bytes:
    return struct.pack(">4sBBBB", magic, version, kind, tag_len, reserved) + body


# -- the codec ----------------------------------------------------------------------------
@pytest.mark.parametrize("keyring", [None, KEY], ids=["plain", "keyed"])
def test_query_and_answer_round_trip_in_small_versioned_datagrams(keyring):
    query, answer = d.Query(NONCE, 7), d.Answer(NONCE, 7, "10.1.0.1:7700", "10.1.0.0/24")
    for message in (query, d.Query(NONCE), answer):
        data = d.encode(message, keyring)
        assert data[:8] == struct.pack(">4sBBBB", b"DNDS", 1, message.TYPE, 18 if keyring else 0, 0)
        assert len(data) < 160 < d.MAX_DATAGRAM
        assert d.decode(data, keyring) == message
        if keyring:
            assert d.decode(data) == message  # a receiver without a key ignores the tag, as on the wire
            with pytest.raises(ProtocolError) as e:
                d.decode(d.encode(message), keyring)  # untagged, where a key is required
            assert e.value.reason == "bad-tag"
    assert answer.endpoint == ("10.1.0.1", 7700)


def _query(**body) -> bytes:
    return datagram(d.QUERY, orjson.dumps(body))


def _answer(**fields) -> bytes:
    body = {"nonce": NONCE, "network": 1, "center": "10.1.0.1:7700", "lan": "10.1.0.0/24", **fields}
    return datagram(d.ANSWER, orjson.dumps({k: v for k, v in body.items() if v is not None}))


def _tampered() -> bytes:
    data = bytearray(d.encode(d.Query(NONCE, 1), KEY))
    data[-20] ^= 1  # a byte of the body
    return bytes(data)


BAD = [
    (b"", None, "truncated"),
    (b"DNDS\x01\x01\x00", None, "truncated"),
    (b"x" * 513, None, "too-large"),
    (wire.encode(Heartbeat("127.0.1.10", 1.0)), None, "bad-magic"),  # a stream message is no datagram
    (KEY.sign(wire.encode(Heartbeat("127.0.1.10", 1.0))), KEY, "bad-magic"),  # nor a tagged one
    (datagram(1, b"{}", version=2), None, "bad-version"),
    (datagram(3, b"{}"), None, "bad-type"),
    (datagram(1, b"{}", reserved=1), None, "bad-header"),
    (datagram(1, b"{}", tag_len=200), None, "truncated"),
    (datagram(1, b"{nonce"), None, "bad-json"),
    (datagram(1, b"[]"), None, "schema"),
    (_query(), None, "schema"),
    (_query(nonce=NONCE, extra=1), None, "schema"),
    (_query(nonce=NONCE.upper()), None, "schema"),
    (_query(nonce=NONCE[:-1]), None, "schema"),
    (_query(nonce=NONCE, network=True), None, "schema"),
    (_query(nonce=NONCE, network=1.0), None, "schema"),
    (_query(nonce=NONCE, network=0), None, "schema"),
    (_query(nonce=NONCE, network=65536), None, "schema"),
    (datagram(d.QUERY, orjson.dumps({"nonce": NONCE, "network": None})), None, "schema"),
    (datagram(d.ANSWER, orjson.dumps({"nonce": NONCE, "network": None, "center": CENTER, "lan": LAN})), None, "schema"),
    (_answer(network=None), None, "schema"),
    (_answer(center="center.lan:7700"), None, "schema"),
    (_answer(center="[::1]:7700"), None, "schema"),
    (_answer(center="10.1.0.1:0"), None, "schema"),
    (_answer(center="10.1.0.1"), None, "schema"),
    (_answer(center=7700), None, "schema"),
    (_answer(lan="fd00::/64"), None, "schema"),
    (_answer(lan="nope"), None, "schema"),
    (d.encode(d.Query(NONCE)), KEY, "bad-tag"),
    (d.encode(d.Query(NONCE), OTHER_KEY), KEY, "bad-tag"),
    (_tampered(), KEY, "bad-tag"),
]


@pytest.mark.parametrize("data, keyring, reason", BAD, ids=[f"{i}-{r}" for i, (_, _, r) in enumerate(BAD)])
def test_bad_datagrams_are_refused_with_a_reason(data, keyring, reason):
    with pytest.raises(ProtocolError) as e:
        d.decode(data, keyring)
    assert e.value.reason == reason, e.value


def test_mutated_datagrams_only_ever_raise_protocol_errors():
    rng = random.Random(13)
    valid = [d.encode(m, k) for k in (None, KEY) for m in (d.Query(NONCE, 3), d.Answer(NONCE, 3, CENTER, LAN))]
    outcomes = {"ok": 0}
    for _ in range(4000):
        data = bytearray(rng.choice(valid))
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(4)
            if op == 0 and data:
                data[rng.randrange(len(data))] = rng.randrange(256)
            elif op == 1:
                data.insert(rng.randrange(len(data) + 1), rng.randrange(256))
            elif op == 2 and data:
                del data[rng.randrange(len(data)):][: rng.randint(1, 8)]
            else:
                data = data[: rng.randrange(len(data) + 1)]
        try:
            d.decode(bytes(data), rng.choice([None, KEY]))
            outcomes["ok"] += 1
        except ProtocolError as e:
            outcomes[e.reason] = outcomes.get(e.reason, 0) + 1
    assert {"bad-tag", "bad-json", "schema", "truncated"} <= set(outcomes), outcomes


# -- the center's side --------------------------------------------------------------------
def test_a_center_answers_queries_from_its_lan_for_its_network_only(caplog):
    caplog.set_level(logging.WARNING, logger="dedupnet.adapters.net.discovery")
    counters = Counters()
    r = responder(counters=counters)
    reply = r.handle(d.encode(d.Query(NONCE)), HOST_IP, 0.0)
    assert d.decode(reply) == d.Answer(NONCE, 1, CENTER, LAN)
    assert d.decode(r.handle(d.encode(d.Query(NONCE, 1)), HOST_IP, 0.0)).network == 1
    assert r.handle(d.encode(d.Query(NONCE)), "127.0.2.10", 0.0) is None  # another LAN's host
    assert r.handle(d.encode(d.Query(NONCE, 2)), HOST_IP, 0.0) is None  # asks for network 2
    assert r.handle(reply, HOST_IP, 0.0) is None  # an answer is not a question
    assert counters.get("discovery_answered") == 2
    assert [counters.get("discovery_ignored", reason=x) for x in ("not-in-lan", "other-network", "unexpected")] == [1, 1, 1]
    # Garbage: counted every time, logged once per 5 s per reason.
    for now in (0.0, 1.0, 2.0, 6.0):
        assert r.handle(b"GET / HTTP/1.1\r\n", "127.0.1.66", now) is None
    assert counters.get("discovery_rejected", reason="bad-magic") == 4
    lines = [rec.getMessage() for rec in caplog.records]
    assert len(lines) == 2 and "127.0.1.66" in lines[0] and "bad-magic" in lines[0]
    assert "(1 of them since the last report)" in lines[0] and "(3 of them since the last report)" in lines[1]


def test_a_center_answers_at_a_bounded_rate():
    counters = Counters()
    r = responder(counters=counters, rate=10)
    query = d.encode(d.Query(NONCE))
    assert sum(r.handle(query, HOST_IP, 0.0) is not None for _ in range(15)) == 10
    assert sum(r.handle(query, HOST_IP, 0.5) is not None for _ in range(15)) == 5
    assert counters.get("discovery_ignored", reason="rate") == 15


def test_a_center_with_a_lan_key_answers_only_tagged_queries_and_tags_its_answers():
    counters = Counters()
    r = responder(KEY, counters)
    assert r.handle(d.encode(d.Query(NONCE)), HOST_IP, 0.0) is None
    assert r.handle(d.encode(d.Query(NONCE), OTHER_KEY), HOST_IP, 0.0) is None
    assert counters.get("discovery_rejected", reason="bad-tag") == 2
    assert d.decode(r.handle(d.encode(d.Query(NONCE), KEY), HOST_IP, 0.0), KEY).nonce == NONCE


@pytest.mark.parametrize("center, lan", [("center.lan:7700", LAN), ("[fd00::1]:7700", "fd00::/64")])
def test_a_center_refuses_at_start_to_announce_what_hosts_would_refuse(center, lan):
    with pytest.raises(ValueError, match="IPv4 only"):
        d.Responder(1, lan, center, None, Counters())


def test_the_announced_address_is_the_listen_address_or_the_center_s_own_in_its_lan():
    assert d.center_address("127.0.1.1", "10.255.0.1", LAN, 7700) == "127.0.1.1:7700"
    # Listening everywhere: its address in the LAN (none on loopback, where lo is left out): its IP.
    assert d.center_address("0.0.0.0", "127.0.1.1", LAN, 7700) == "127.0.1.1:7700"


# -- the host's side ----------------------------------------------------------------------
def test_a_host_under_a_lan_key_takes_only_the_answer_to_its_own_query():
    counters = Counters()
    search = d.Search(keyring=KEY, counters=counters)
    earlier = d.Search(keyring=KEY)  # a genuine answer to an earlier query, recorded and replayed
    genuine = responder(KEY)
    replayed = genuine.handle(earlier.datagram, HOST_IP, 0.0)
    nonce = search.query.nonce
    forged = d.encode(d.Answer(nonce, 1, "127.0.1.66:7700", LAN), OTHER_KEY)
    untagged = d.encode(d.Answer(nonce, 1, "127.0.1.66:7700", LAN))
    for data in (replayed, forged, untagged, search.datagram):
        assert search.receive(data, "127.0.1.66") is None
    assert search.rejected == {"nonce": 1, "bad-tag": 2, "unexpected": 1}
    assert counters.get("discovery_rejected", reason="bad-tag") == 2 and not search.found
    answer = search.receive(genuine.handle(search.datagram, HOST_IP, 0.0), "127.0.1.1")
    assert answer == d.Answer(nonce, 1, CENTER, LAN) and search.result() == answer


def test_several_centers_answering_is_an_error_that_names_them():
    search = d.Search()
    one, two = responder(), d.Responder(2, LAN, "127.0.1.2:7700", None, Counters())
    for r in (one, one, two):  # the same center twice (a re-sent query) counts once
        search.receive(r.handle(search.datagram, HOST_IP, 0.0), "127.0.1.1")
    with pytest.raises(DiscoveryError, match=r"network 1 at 127.0.1.1:7700 .* network 2 at 127.0.1.2:7700.*--network"):
        search.result()
    asking_for_2 = d.Search(network=2)
    assert asking_for_2.receive(one.handle(d.encode(d.Query(asking_for_2.query.nonce)), HOST_IP, 0.0), "x") is None
    assert asking_for_2.rejected == {"other-network": 1}


# -- settings and flags --------------------------------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    (dict(discovery_port=0), "discovery_port must be within 1..65535"),
    (dict(discovery_timeout=0), "discovery_timeout must be positive"),
    (dict(discovery_address="ff02::1"), "discovery_address must be an IPv4 address"),
])
def test_discovery_settings_are_checked(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_settings(**overrides)


def test_discovery_flags_and_what_center_auto_no_longer_needs(capsys):
    center = build_parser().parse_args(["center", "--no-discovery", "--discovery-port", "9"])
    assert (center.discovery, center.discovery_port) == (False, 9)
    local = build_parser().parse_args(["local", "--center", "auto", "--discovery-address", "10.1.0.255",
                                       "--discovery-timeout", "4"])
    assert (local.center, local.discovery_address, local.discovery_timeout) == ("auto", "10.1.0.255", 4.0)
    assert load_settings().discovery and load_settings().discovery_port == d.DEFAULT_PORT
    assert main(["local", "--center", "127.0.0.1:1"]) == 2  # an explicit center still needs its network
    assert "missing setting(s): --network" in capsys.readouterr().err


# -- the trio adapters on loopback --------------------------------------------------------
async def test_a_host_finds_a_center_by_broadcast_on_loopback():
    counters = Counters()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(d.serve_discovery, responder(KEY, counters), 0)
        search = d.Search(keyring=KEY)
        with trio.fail_after(10):
            answer = await d.find_center(search, [d.Target(LOOPBACK_BROADCAST, HOST_IP)], port, timeout=5)
        nursery.cancel_scope.cancel()
    assert answer.center == CENTER and answer.network == 1 and answer.nonce == search.query.nonce
    assert counters.get("discovery_answered") >= 1


async def test_nobody_answering_ends_in_a_clear_error_after_backing_off(autojump_clock):
    """A listener on the port that never answers: the queries come at growing intervals
    (0.25 s doubling to 2 s, each up to a quarter shorter) until the deadline."""
    port = free_udp_port()
    arrivals: list[float] = []

    async def silent(task_status=trio.TASK_STATUS_IGNORED):
        with await listener(port) as sock:
            task_status.started()
            while True:
                await sock.recvfrom(1024)
                arrivals.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        await nursery.start(silent)
        start = trio.current_time()
        with pytest.raises(DiscoveryError) as e:
            await d.find_center(d.Search(network=4, keyring=KEY), [d.Target(LOOPBACK_BROADCAST, HOST_IP)], port,
                                timeout=10)
        assert trio.current_time() - start == pytest.approx(10)
        nursery.cancel_scope.cancel()
    text = str(e.value)
    assert f"no center answered on UDP port {port} within 10 s" in text and "for network 4" in text
    assert f"{len(arrivals)} to {LOOPBACK_BROADCAST}" in text
    assert "--lan-key-file" in text and "--center HOST:PORT" in text
    gaps = [b - a for a, b in zip([start, *arrivals], arrivals)]
    assert gaps[0] == 0
    for gap, wait in zip(gaps[1:], [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]):
        assert 0.75 * wait <= gap <= wait, gaps


async def test_forged_and_replayed_answers_are_rejected_and_a_genuine_one_found(autojump_clock):
    """A rogue on the LAN answers every query with a forged answer (a guessed key), a
    genuine answer recorded earlier (another nonce) and an untagged one. Alone, it makes
    the search fail, saying why; beside the real center, it is ignored."""
    port = free_udp_port()
    replay = responder(KEY).handle(d.Search(keyring=KEY).datagram, HOST_IP, 0.0)

    async def rogue(task_status=trio.TASK_STATUS_IGNORED):
        with await listener(port) as sock:
            task_status.started()
            while True:
                data, source = await sock.recvfrom(1024)
                nonce = d.decode(data).nonce  # read without the key: the nonce is not secret
                for fake in (d.encode(d.Answer(nonce, 1, "127.0.1.66:7700", LAN), OTHER_KEY), replay,
                             d.encode(d.Answer(nonce, 1, "127.0.1.66:7700", LAN))):
                    await sock.sendto(fake, source)

    targets = [d.Target(LOOPBACK_BROADCAST, HOST_IP)]
    async with trio.open_nursery() as nursery:
        await nursery.start(rogue)
        counters = Counters()
        with pytest.raises(DiscoveryError) as e:
            await d.find_center(d.Search(keyring=KEY, counters=counters), targets, port, timeout=3)
        assert "answers rejected:" in str(e.value) and "bad-tag" in str(e.value) and " nonce" in str(e.value)
        queries = counters.get("discovery_rejected", reason="nonce")
        assert queries >= 2 and counters.get("discovery_rejected", reason="bad-tag") == 2 * queries

        await nursery.start(d.serve_discovery, responder(KEY), port)
        counters = Counters()
        answer = await d.find_center(d.Search(keyring=KEY, counters=counters), targets, port, timeout=3)
        assert answer.center == CENTER
        assert counters.get("discovery_rejected", reason="bad-tag") >= 2
        assert counters.get("discovery_rejected", reason="nonce") >= 1
        nursery.cancel_scope.cancel()


async def test_a_center_whose_discovery_port_is_taken_logs_it_and_serves_on(caplog):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as holder:  # no SO_REUSEADDR: exclusive
        holder.bind(("0.0.0.0", 0))
        counters = Counters()
        async with trio.open_nursery() as nursery:
            assert await nursery.start(d.serve_discovery, responder(counters=counters), holder.getsockname()[1]) is None
    assert counters.get("discovery_failed", reason="bind") == 1
    assert any("discovery off: cannot bind UDP" in r.getMessage() and "--center 127.0.1.1:7700" in r.getMessage()
               for r in caplog.records)


# -- dedupnet local --center auto, a real process -----------------------------------------
async def test_dedupnet_local_center_auto_finds_a_keyed_center_and_its_urls_come_back(redis_url, prefix, tmp_path):
    """No --network, no center address: the host learns both from the center's answer,
    connects with the LAN key, and the URLs pushed into its URL_pool come back as its
    tasks (one host: every URL is its own)."""
    keys = tmp_path / "lan.keys"
    write_key_file(keys, [new_key_line()])
    center = CenterDaemon(CenterSettings(5, "127.0.5.1", 0, "127.0.5.0/24", discovery_port=0, lan_key_file=str(keys),
                                         heartbeat_interval=0.2),
                          Store(redis_url, f"{prefix}:center"))
    host_store = Store(redis_url, f"{prefix}:host")
    urls = [f"http://site{i % 3}.example/{i}" for i in range(40)]
    log = tmp_path / "host.log"
    proc = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(center.run)
            assert center.discovery_port
            with open(log, "wb") as out:
                proc = subprocess.Popen([*DEDUPNET, "local", "--center", "auto", "--ip", "127.0.5.10",
                                         "--discovery-address", LOOPBACK_BROADCAST,
                                         "--discovery-port", str(center.discovery_port), "--lan-key-file", str(keys),
                                         "--redis", redis_url, "--prefix", f"{prefix}:host", "--no-crawl",
                                         "--set-size", "20"],
                                        stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
            pools = HostPools(host_store, exact=True)
            with trio.fail_after(30):
                while "127.0.5.10" not in map(str, center.conns):
                    assert proc.poll() is None, log.read_text()
                    await trio.sleep(0.05)
                assert pools.push(urls) == len(urls)
                while sorted(u for _, u in pools.all_tasks()) != sorted(urls):
                    assert proc.poll() is None, log.read_text()
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
        for store in (host_store, center.pools.store):
            store.delete_prefix()
            store.close()
    assert center.counters.get("discovery_answered") >= 1
    assert center.counters.total("discovery_rejected") == 0
    text = log.read_text()
    assert f"looking for the center on UDP port {center.discovery_port}: {LOOPBACK_BROADCAST}" in text
    assert f"found the center of network 5 at 127.0.5.1:{center.port} (LAN 127.0.5.0/24)" in text
    assert "host 127.0.5.10 (network 5, LAN 127.0.5.0/24)" in text


def test_dedupnet_local_center_auto_says_so_when_nobody_answers():
    port = free_udp_port()
    out = subprocess.run([*DEDUPNET, "local", "--center", "auto", "--ip", HOST_IP, "--discovery-address",
                          LOOPBACK_BROADCAST, "--discovery-port", str(port), "--discovery-timeout", "0.3", "--no-crawl"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 1, out.stderr
    assert f"dedupnet local: no center answered on UDP port {port} within 0.3 s" in out.stderr
    assert "Or give --center HOST:PORT" in out.stderr


# -- across a bridge, between network namespaces ------------------------------------------
async def test_a_host_finds_its_center_by_broadcast_across_a_bridge(lab, tmp_path):
    """Center and host in two namespaces on one bridge, 10.9.0.0/24: the host is given
    nothing but ``--center auto`` and broadcasts to its interface's broadcast address
    (netifaces); the center, listening on every address, answers with its LAN address.
    A second host whose address has no broadcast configured asks from the test process,
    through the limited broadcast on its interface."""
    trio.socket.set_custom_socket_factory(netns.NetnsSocketFactory())
    lab.add("sw")
    lab.bridge("sw")
    for name, dev, address, brd in (("c", "lan0", "10.9.0.1/24", True), ("h", "eth0", "10.9.0.10/24", True),
                                    ("h2", "eth0", "10.9.0.11/24", False)):
        lab.add(name)
        lab.veth(name, dev, "sw", f"p{name}")
        lab.ip("sw", "link", "set", f"p{name}", "master", "br0")
        lab.ip(name, "addr", "add", address, *(("brd", "+") if brd else ()), "dev", dev)
    # --insecure: discovery, not keys, is what this test is about (tests/test_exposure.py is about keys).
    center = Daemon("c", "center", 1, [*DEDUPNET, "center", "--network", "1", "--listen", "0.0.0.0:7700", "--insecure",
                                       "--data-dir", str(tmp_path / "c")], 7700, tmp_path / "c.log")
    host = Daemon("h", "host", 1, [*DEDUPNET, "local", "--center", "auto", "--listen", "0.0.0.0:7701", "--no-crawl",
                                   "--insecure", "--data-dir", str(tmp_path / "h")], 7701, tmp_path / "h.log")
    try:
        with trio.fail_after(60):
            center.start(lab, tmp_path)
            while not await center.poll(lab):
                center.check_alive()
                await trio.sleep(0.1)
            host.start(lab, tmp_path)
            while not ((await host.poll(lab)) or {}).get("connected"):
                host.check_alive()
                await trio.sleep(0.1)
            await center.poll(lab)
        with netns.entered(lab.ns("h2")):
            targets = netinfo.broadcast_targets()
        assert targets == [("eth0", "10.9.0.11", "255.255.255.255")]
        with in_netns(lab.ns("h2")), trio.fail_after(10):
            second = await d.find_center(d.Search(), [d.Target(b, a) for _, a, b in targets], 7799, timeout=5)
    finally:
        with trio.CancelScope(shield=True):  # the host first: it leaves its LAN through its center
            codes = await stop([host]) | await stop([center])
        trio.socket.set_custom_socket_factory(None)
    assert host.status["ip"] == "10.9.0.10" and host.status["network"] == 1
    assert host.status["center"] == "10.9.0.1:7700"
    assert "10.9.0.10" in center.status["members"]
    assert center.status["counters"]["discovery_answered"] >= 1
    text = host.log.read_text()
    assert "looking for the center on UDP port 7799: 10.9.0.255 via eth0 10.9.0.10" in text
    assert "found the center of network 1 at 10.9.0.1:7700 (LAN 10.9.0.0/24)" in text
    assert second.center == "10.9.0.1:7700" and second.network == 1
    assert codes == {host.ns: 0, center.ns: 0}, (center.log_tail(), host.log_tail())
