"""Safe by default (dedupnet/service/exposure.py): a daemon that listens beyond loopback
without authentication for a role it serves does not start, and says in one line what
to do; ``--insecure`` starts it with a warning repeated while it runs; loopback needs
nothing. On real interfaces (network namespaces) a forged peer center and a host
without the key are refused by a center started as the refusal says."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest
import trio

from dedupnet import cli
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.net.transport import ConnectionClosed, connect
from dedupnet.codec.auth import keyring_from
from dedupnet.codec.messages import Error, Register
from dedupnet.service.config import load_settings
from dedupnet.service.daemons import fetch_status
from dedupnet.service.exposure import Unprotected, check_exposure, is_loopback, warn_while_running

from . import netns
from .helpers import DEDUPNET, dedupnet
from .netns import in_netns
from .netns_lab import Daemon, stop

ROOT = Path(__file__).resolve().parent.parent


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


# -- the rule -----------------------------------------------------------------------------
@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.0.3.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), (None, False), ("10.1.0.1", False), ("192.0.2.7", False),
])
def test_what_counts_as_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_what_each_role_needs(tmp_path):
    s = load_settings(network=1)
    assert check_exposure(s, "center", ("127.0.1.1", 7700), has_peers=True) is None  # loopback: as before
    with pytest.raises(Unprotected, match=r"without a LAN key \(lan_key_file\): run `dedupnet certs --networks 1`"):
        check_exposure(s, "center", ("0.0.0.0", 7700))
    with pytest.raises(Unprotected, match="TLS between centers"):
        check_exposure(load_settings(network=1, lan_key_file="k"), "center", ("10.1.0.1", 7700), has_peers=True)
    # A LAN key is enough for a center without peers and for a host.
    assert check_exposure(load_settings(network=1, lan_key_file="k"), "center", ("10.1.0.1", 7700)) is None
    assert check_exposure(load_settings(network=1, lan_key_file="k"), "host", ("0.0.0.0", 7701)) is None
    with pytest.raises(Unprotected):
        check_exposure(s, "host", ("10.1.0.10", 0))
    warning = check_exposure(load_settings(network=1, insecure=True), "center", ("0.0.0.0", 7700), has_peers=True)
    assert warning.startswith("--insecure: listening on 0.0.0.0:7700") and "lan_key_file" in warning
    assert load_settings(network=1, **{"insecure": True}).insecure  # the config key of --insecure
    assert cli.build_parser().parse_args(["center", "--insecure"]).insecure


def test_what_dedupnet_certs_prints_is_enough(tmp_path, capsys):
    """The refusal says: run `dedupnet certs` and add the settings it prints. Those
    settings, as a config file, let an exposed center with peers start."""
    assert cli.main(["certs", "--dir", str(tmp_path / "certs"), "--networks", "1-2"]) == 0
    out = capsys.readouterr().out
    block = out.split("# center of network 1 ")[1].split("\n\n")[0]
    config = tmp_path / "center1.toml"
    config.write_text("\n".join(line for line in block.splitlines()[1:] if not line.startswith("#")) + "\n")
    settings = load_settings(config, network=1)
    assert check_exposure(settings, "center", ("0.0.0.0", 7700), has_peers=True) is None


@pytest.mark.parametrize("args, what", [
    (["center", "--network", "1", "--listen", "0.0.0.0:17799", "--lan", "10.1.0.0/24", "--ip", "10.1.0.1",
      "--no-discovery"], "without a LAN key (lan_key_file): "),
    (["center", "--network", "1", "--listen", "0.0.0.0:17799", "--lan", "10.1.0.0/24", "--ip", "10.1.0.1",
      "--peer", "2,127.0.2.1:17799,127.0.2.0/24"],
     "without a LAN key (lan_key_file) or TLS between centers (tls_cert, tls_key, tls_ca): "),
    (["local", "--network", "1", "--center", "127.0.1.1:17799", "--ip", "127.0.1.10", "--listen", "0.0.0.0:17798",
      "--no-crawl"],
     "without a LAN key (lan_key_file): "),
])
def test_an_exposed_daemon_without_keys_refuses_to_start_in_one_line(tmp_path, args, what):
    """Nothing is bound, no Redis started: the check comes first. (Every address the
    daemons would dial is loopback, so that even code without the check sends nothing
    out of this machine.)"""
    out = dedupnet(*args, "--data-dir", str(tmp_path / "data"), cwd=ROOT)
    assert out.returncode == 2, out.stderr
    line = one_line(out.stderr)
    assert line.startswith(f"dedupnet {args[0]}: refusing to listen on ") and what in line
    assert "run `dedupnet certs --networks 1`" in line and "--insecure" in line
    assert not (tmp_path / "data").exists()


async def test_insecure_warns_at_start_and_every_minute(autojump_clock, caplog):
    async with trio.open_nursery() as nursery:
        nursery.start_soon(warn_while_running, "--insecure: listening on 0.0.0.0:7700 ...")
        await trio.sleep(150)
        nursery.cancel_scope.cancel()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.getMessage().startswith("--insecure")]
    assert len(warnings) == 3  # at 0, 60 and 120 s


# -- on real interfaces ---------------------------------------------------------------------
# Center of network 2: LAN 10.2.0.0/24 (10.2.0.1 on lan0), WAN 10.255.0.2 (wan0). Its
# configured peer is network 1 at 10.255.0.1, LAN 10.1.0.0/24 (it dials us: lower id).
# Namespace h (10.2.0.10) is on the LAN, namespace x (10.1.0.66, an unused address
# inside the peer's CIDR) on the WAN leg.
PORT = 7700
PEER = "1,10.255.0.1:7700,10.1.0.0/24"
HOST_IP, FORGER_IP = "10.2.0.10", "10.1.0.66"


def build(lab) -> None:
    for name in ("c", "h", "x"):
        lab.add(name)
    lab.veth("c", "lan0", "h", "eth0")
    lab.ip("c", "addr", "add", "10.2.0.1/24", "dev", "lan0")
    lab.ip("h", "addr", "add", f"{HOST_IP}/24", "dev", "eth0")
    lab.veth("c", "wan0", "x", "eth0")
    lab.ip("c", "addr", "add", "10.255.0.2/24", "dev", "wan0")
    lab.ip("c", "route", "add", "10.1.0.0/24", "dev", "wan0")
    lab.ip("x", "addr", "add", f"{FORGER_IP}/24", "dev", "eth0")
    lab.ip("x", "route", "add", "10.255.0.0/24", "dev", "eth0")


def center_argv(tmp_path: Path, *extra: str) -> list[str]:
    return [*DEDUPNET, "center", "--network", "2", "--listen", f"0.0.0.0:{PORT}", "--lan", "10.2.0.0/24",
            "--ip", "10.255.0.2", "--peer", PEER, "--no-discovery", "--data-dir", str(tmp_path / "c"), *extra]


async def start(lab, center: Daemon, tmp_path: Path, key_file: str | None = None) -> None:
    center.start(lab, tmp_path)
    with trio.fail_after(60):
        while True:
            center.check_alive()
            try:
                with in_netns(lab.ns("c")):
                    center.status = await fetch_status(("127.0.0.1", PORT), timeout=3.0, key_file=key_file)
                return
            except Exception:  # noqa: BLE001 - not answering yet
                await trio.sleep(0.1)


async def register(lab, ns: str, ip: str, network: int, role: str, keyring=None) -> list:
    """What the center answers a Register from ``ip`` in namespace ``ns``, until it
    closes the connection or 2 s pass (then the connection was accepted)."""
    replies: list = []
    with in_netns(lab.ns(ns)), trio.fail_after(20):
        conn = await connect("10.2.0.1" if ns == "h" else "10.255.0.2", PORT,
                             Register(ip, network, role, f"{ip}:{PORT}", "10.1.0.0/24" if ns == "x" else "10.2.0.0/24"),
                             local_ip=ip, counters=Counters(), keyring=keyring)
        async with conn:
            with trio.move_on_after(2):
                try:
                    while True:
                        replies.append(await conn.receive())
                except ConnectionClosed:
                    replies.append("closed")
    return replies


def refused_with(replies: list, reason: str) -> bool:
    return replies[-1:] == ["closed"] and any(isinstance(m, Error) and m.reason == reason for m in replies)


async def test_forged_peer_and_keyless_host_are_refused_in_the_default_configuration(lab, tmp_path):
    """A center listening on its real interfaces, configured as an operator would
    (its network, LAN and peer), with nothing else: it does not start. Started with
    the settings `dedupnet certs` prints, it refuses a process that registers as the
    peer center from inside the peer's CIDR without TLS, and a host without the LAN
    key; a host with the key is served."""
    trio.socket.set_custom_socket_factory(netns.NetnsSocketFactory())
    build(lab)
    center = None
    try:
        out = subprocess.run(lab.exec_argv("c", center_argv(tmp_path)), capture_output=True, text=True,
                             timeout=60, cwd=ROOT)
        assert out.returncode == 2, out.stderr
        assert "refusing to listen on 0.0.0.0:7700" in one_line(out.stderr)

        assert cli.main(["certs", "--dir", str(tmp_path / "certs"), "--networks", "1-2"]) == 0
        certs = tmp_path / "certs"
        lan_key = str(certs / "lan-2.key")
        center = Daemon("c", "center", 2, center_argv(tmp_path, "--tls-cert", str(certs / "center-2.pem"),
                                                      "--tls-key", str(certs / "center-2-key.pem"),
                                                      "--tls-ca", str(certs / "ca.pem"), "--lan-key-file", lan_key),
                        PORT, tmp_path / "c.log")
        await start(lab, center, tmp_path, key_file=lan_key)

        forged = await register(lab, "x", FORGER_IP, 1, "center")
        assert refused_with(forged, "tls"), forged
        keyless = await register(lab, "h", HOST_IP, 2, "host")
        assert refused_with(keyless, "bad-tag"), keyless
        keyed = await register(lab, "h", HOST_IP, 2, "host", keyring=keyring_from(lan_key))
        assert "closed" not in keyed and not any(isinstance(m, Error) for m in keyed), keyed
        with in_netns(lab.ns("c")):
            status = await fetch_status(("127.0.0.1", PORT), key_file=lan_key)
    finally:
        with trio.CancelScope(shield=True):
            codes = await stop([center]) if center is not None else {}
        trio.socket.set_custom_socket_factory(None)
    counters = status["counters"]
    assert counters['handshake_failed{reason="tls"}'] == 1
    assert counters['bad_input{reason="bad-tag"}'] == 1
    assert "net:1" not in status["members"]  # the forger never joined as network 1
    assert codes == {"c": 0}, center.log_tail()


async def test_insecure_center_starts_on_real_interfaces_and_warns(lab, tmp_path):
    """--insecure: the operator's choice, said in the log; the keyless host it lets in
    is what the operator accepted."""
    trio.socket.set_custom_socket_factory(netns.NetnsSocketFactory())
    build(lab)
    center = Daemon("c", "center", 2, center_argv(tmp_path, "--insecure"), PORT, tmp_path / "c.log")
    try:
        await start(lab, center, tmp_path)
        keyless = await register(lab, "h", HOST_IP, 2, "host")
        assert "closed" not in keyless and not any(isinstance(m, Error) for m in keyless), keyless
    finally:
        with trio.CancelScope(shield=True):
            codes = await stop([center])
        trio.socket.set_custom_socket_factory(None)
    text = center.log.read_text()
    warnings = [line for line in text.splitlines() if " WARNING " in line and "--insecure: listening on" in line]
    assert len(warnings) == 1 and "0.0.0.0:7700" in warnings[0] and "lan_key_file" in warnings[0], text[-3000:]
    assert codes == {"c": 0}, center.log_tail()
