"""Structural checks of the two-LAN Docker Compose deployment in compose/.

There is no Docker engine on the build machines, so the files are read and checked
for consistency instead of run: networks and addresses, who is on which network, and
that every address a daemon is given (its center, its peers, its Redis) points at the
service that should be there.

Each command is read with the small parser below (to check where its addresses point)
and parsed with the real ``dedupnet.cli.build_parser()`` too.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import shlex
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml  # pyyaml, from the [test] extras

from dedupnet.cli import build_parser
from dedupnet.service.config import Settings, load_settings
from dedupnet.service.exposure import check_exposure

COMPOSE_DIR = Path(__file__).resolve().parent.parent / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
WAN = "wan"
EXPECTED_SUBNETS = {"lan1": "10.1.0.0/24", "lan2": "10.2.0.0/24", WAN: "10.0.0.0/24"}

# Flags of each daemon as the compose file uses them: required, and the repeatable ones.
DAEMON_FLAGS = {
    "center": {"required": {"--network", "--listen", "--lan", "--peer", "--http", "--redis", "--prefix",
                            "--tls-cert", "--tls-key", "--tls-ca", "--lan-tls", "--lan-key-file"},
               "repeatable": {"--peer"}},
    "local": {"required": {"--network", "--ip", "--center", "--lan", "--listen", "--redis", "--prefix",
                           "--tls-ca", "--lan-tls", "--lan-key-file"},
              "repeatable": set()},
}
#: Flags that take no value (parse_flags records them as "true").
SWITCHES = {"--lan-tls"}
CERTS_DIR = "/certs"


# -- reading the file ------------------------------------------------------------------


def load_compose() -> dict:
    with open(COMPOSE_FILE, encoding="utf-8") as f:
        return yaml.safe_load(f)  # also resolves the <<: merge keys of the x- templates


def argv_of(service: dict) -> list[str]:
    command = service.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def parse_flags(argv: list[str], repeatable: set[str]) -> dict[str, list[str]]:
    """``--flag value`` pairs after the program and subcommand. Every flag takes one
    value; only ``repeatable`` flags may appear more than once."""
    flags: dict[str, list[str]] = {}
    rest = list(argv)
    while rest:
        flag = rest.pop(0)
        if not re.fullmatch(r"--[a-z][a-z0-9-]*", flag):
            raise ValueError(f"expected a --flag, got {flag!r} in {argv}")
        if flag in SWITCHES:
            if flag in flags:
                raise ValueError(f"{flag} given twice in {argv}")
            flags[flag] = ["true"]
            continue
        if not rest or rest[0].startswith("--"):
            raise ValueError(f"{flag} has no value in {argv}")
        if flag in flags and flag not in repeatable:
            raise ValueError(f"{flag} given twice in {argv}")
        flags.setdefault(flag, []).append(rest.pop(0))
    return flags


def parse_endpoint(text: str) -> tuple[ipaddress.IPv4Address, int]:
    host, sep, port = text.rpartition(":")
    assert sep and port.isdigit() and 1 <= int(port) <= 65535, f"not ADDRESS:PORT: {text!r}"
    return ipaddress.IPv4Address(host), int(port)


class Deployment:
    """The compose file, with each service's role, LAN, addresses and daemon flags."""

    def __init__(self, doc: dict):
        self.doc = doc
        self.services: dict[str, dict] = doc["services"]
        self.subnets = {
            name: ipaddress.ip_network(net["ipam"]["config"][0]["subnet"])
            for name, net in doc["networks"].items()
        }
        self.flags: dict[str, dict[str, list[str]]] = {}
        self.role: dict[str, str] = {}
        for name, svc in self.services.items():
            argv = argv_of(svc)
            if argv[:1] == ["dedupnet"] and len(argv) > 1 and argv[1] in DAEMON_FLAGS:
                self.role[name] = argv[1]
                self.flags[name] = parse_flags(argv[2:], DAEMON_FLAGS[argv[1]]["repeatable"])
            elif argv[:2] == ["dedupnet", "certs"]:
                self.role[name] = "certs"
                self.flags[name] = parse_flags(argv[2:], set())
            elif str(svc.get("image", "")).startswith(("redis", "valkey")):
                self.role[name] = "redis"
            else:
                self.role[name] = "other"

    def of_role(self, role: str) -> list[str]:
        return [name for name, r in self.role.items() if r == role]

    def networks(self, name: str) -> dict[str, dict]:
        nets = self.services[name].get("networks", {})
        assert isinstance(nets, dict), f"{name}: networks must be a mapping with fixed addresses"
        return nets

    def address(self, name: str, network: str) -> ipaddress.IPv4Address:
        return ipaddress.IPv4Address(self.networks(name)[network]["ipv4_address"])

    def lan(self, name: str) -> str:
        lans = [n for n in self.networks(name) if n != WAN]
        assert len(lans) == 1, f"{name} must be on exactly one LAN, is on {lans}"
        return lans[0]

    def one(self, name: str, flag: str) -> str:
        (value,) = self.flags[name][flag]
        return value

    def center_of_lan(self, lan: str) -> str:
        centers = [c for c in self.of_role("center") if self.lan(c) == lan]
        assert len(centers) == 1, f"LAN {lan} must have exactly one center, has {centers}"
        return centers[0]


@pytest.fixture(scope="module")
def dep() -> Deployment:
    return Deployment(load_compose())


# -- networks and addresses ----------------------------------------------------------------


def test_networks_are_two_lans_and_a_wan(dep):
    assert {name: str(net) for name, net in dep.subnets.items()} == EXPECTED_SUBNETS


def test_every_service_has_an_image_or_build_and_a_command(dep):
    for name, svc in dep.services.items():
        assert svc.get("image") or svc.get("build"), f"{name} has neither image nor build"
        assert argv_of(svc), f"{name} has no command"
        assert dep.role[name] != "other", f"{name} is neither a dedupnet daemon nor a Redis server"


def test_the_deployment_has_two_centers_four_hosts_and_a_redis_per_lan(dep):
    assert sorted(dep.of_role("center")) == ["center1", "center2"]
    assert sorted(dep.of_role("local")) == ["host1a", "host1b", "host2a", "host2b"]
    assert sorted(dep.lan(r) for r in dep.of_role("redis")) == ["lan1", "lan2"]


def test_centers_are_on_their_lan_and_on_the_wan(dep):
    for name in dep.of_role("center"):
        nets = set(dep.networks(name))
        assert WAN in nets and len(nets) == 2, f"{name} must be on one LAN and on {WAN}: {sorted(nets)}"


def test_hosts_and_redis_servers_are_on_their_lan_only(dep):
    for name in dep.of_role("local") + dep.of_role("redis"):
        assert list(dep.networks(name)) == [dep.lan(name)], f"{name} must be on its LAN only"


def test_every_address_is_fixed_inside_its_subnet_and_unique(dep):
    seen: dict[ipaddress.IPv4Address, str] = {}
    for name in dep.services:
        for network in dep.networks(name):
            assert network in dep.subnets, f"{name} is on undeclared network {network}"
            addr = dep.address(name, network)
            subnet = dep.subnets[network]
            assert addr in subnet, f"{name}: {addr} is not in {network} {subnet}"
            assert addr not in (subnet.network_address, subnet.broadcast_address, subnet.network_address + 1), \
                f"{name}: {addr} is the network, broadcast or gateway address of {subnet}"
            assert addr not in seen, f"{addr} is used by both {seen[addr]} and {name}"
            seen[addr] = f"{name} on {network}"


# -- daemon flags ------------------------------------------------------------------------


def test_daemons_use_the_real_subcommands(dep):
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name in dep.of_role("center") + dep.of_role("local"):
        assert dep.role[name] in sub.choices, f"{name}: dedupnet has no subcommand {dep.role[name]!r}"


def test_daemon_commands_parse_with_the_real_cli(dep):
    for name in dep.of_role("center") + dep.of_role("local"):
        argv = argv_of(dep.services[name])
        args = build_parser().parse_args(argv[argv.index(dep.role[name]):])
        assert args.command == dep.role[name], name


def test_daemons_get_exactly_their_flags(dep):
    for name in dep.of_role("center") + dep.of_role("local"):
        assert set(dep.flags[name]) == DAEMON_FLAGS[dep.role[name]]["required"], name


def test_listen_and_http_are_endpoints(dep):
    for name in dep.of_role("center") + dep.of_role("local"):
        parse_endpoint(dep.one(name, "--listen"))
        if dep.role[name] == "center":
            parse_endpoint(dep.one(name, "--http"))


def test_each_center_serves_its_own_lan_with_a_unique_network_id(dep):
    ids = {}
    for name in dep.of_role("center"):
        assert dep.one(name, "--lan") == str(dep.subnets[dep.lan(name)]), name
        network = int(dep.one(name, "--network"))
        assert 1 <= network <= 65535, name
        assert network not in ids, f"{name} and {ids.get(network)} share network id {network}"
        ids[network] = name


def test_hosts_point_at_their_lan_center(dep):
    for name in dep.of_role("local"):
        lan = dep.lan(name)
        center = dep.center_of_lan(lan)
        assert dep.one(name, "--ip") == str(dep.address(name, lan)), f"{name}: --ip is not its own address"
        assert dep.one(name, "--lan") == str(dep.subnets[lan]), name
        assert dep.one(name, "--network") == dep.one(center, "--network"), name
        addr, port = parse_endpoint(dep.one(name, "--center"))
        assert addr == dep.address(center, lan), f"{name}: --center is not {center}'s address on {lan}"
        assert port == parse_endpoint(dep.one(center, "--listen"))[1], f"{name}: --center port is not {center}'s"


def test_peers_are_the_other_centers_by_wan_address(dep):
    centers = dep.of_role("center")
    by_wan = {dep.address(c, WAN): c for c in centers}
    for name in centers:
        peered = set()
        for peer in dep.flags[name]["--peer"]:
            network, endpoint, cidr = peer.split(",")
            addr, port = parse_endpoint(endpoint)
            assert addr in by_wan, f"{name}: --peer {peer} is not a center's WAN address"
            other = by_wan[addr]
            assert other != name, f"{name} peers with itself"
            assert port == parse_endpoint(dep.one(other, "--listen"))[1], f"{name}: --peer {peer}: wrong port"
            assert network == dep.one(other, "--network"), f"{name}: --peer {peer}: wrong network id"
            assert ipaddress.ip_network(cidr) == dep.subnets[dep.lan(other)], f"{name}: --peer {peer}: wrong CIDR"
            assert other not in peered, f"{name} lists {other} twice"
            peered.add(other)
        assert peered == set(centers) - {name}, f"{name} does not peer with every other center"


def test_redis_urls_name_a_reachable_redis_service(dep):
    redis_services = set(dep.of_role("redis"))
    prefixes: dict[tuple[str, str], str] = {}
    for name in dep.of_role("center") + dep.of_role("local"):
        url = urlsplit(dep.one(name, "--redis"))
        assert url.scheme == "redis" and url.port == 6379, f"{name}: {url.geturl()}"
        assert url.hostname in redis_services, f"{name}: --redis names no redis service ({url.hostname})"
        assert dep.lan(url.hostname) in dep.networks(name), f"{name} cannot reach {url.hostname}"
        key = (url.hostname, url.path)
        prefix = dep.one(name, "--prefix")
        assert (key, prefix) not in prefixes, f"{name} and {prefixes.get((key, prefix))} share prefix {prefix}"
        prefixes[(key, prefix)] = name


def test_redis_servers_persist_and_keep_fingerprints_compact(dep):
    for name in dep.of_role("redis"):
        argv = argv_of(dep.services[name])
        opts = dict(zip(argv[1::2], argv[2::2]))
        assert opts.get("--appendonly") == "yes", name
        assert int(opts.get("--set-max-intset-entries", 0)) >= 1048576, name


def test_depends_on_names_existing_services(dep):
    for name, svc in dep.services.items():
        for other in svc.get("depends_on", {}):
            assert other in dep.services, f"{name} depends on unknown service {other}"


# -- TLS ---------------------------------------------------------------------


def test_a_certs_service_makes_a_certificate_for_every_center_first(dep):
    (certs,) = dep.of_role("certs")
    argv = argv_of(dep.services[certs])
    args = build_parser().parse_args(argv[1:])  # the real CLI accepts it
    assert args.dir == CERTS_DIR
    assert set(args.networks) == {int(dep.one(c, "--network")) for c in dep.of_role("center")}
    assert dep.services[certs].get("restart") == "no", "a one-shot job, not a daemon"
    assert f"certs:{CERTS_DIR}" in dep.services[certs]["volumes"]
    assert "certs" in dep.doc["volumes"]
    for name in dep.of_role("center"):
        assert dep.services[name]["depends_on"]["certs"]["condition"] == "service_completed_successfully", name


def test_centers_peer_over_tls_with_their_own_network_certificate(dep):
    for name in dep.of_role("center"):
        n = dep.one(name, "--network")
        assert dep.one(name, "--tls-cert") == f"{CERTS_DIR}/center-{n}.pem", name
        assert dep.one(name, "--tls-key") == f"{CERTS_DIR}/center-{n}-key.pem", name
        assert dep.one(name, "--tls-ca") == f"{CERTS_DIR}/ca.pem", name


def test_every_daemon_mounts_the_certificates_read_only_and_lans_use_tls(dep):
    for name in dep.of_role("center") + dep.of_role("local"):
        assert f"certs:{CERTS_DIR}:ro" in dep.services[name]["volumes"], name
        assert dep.one(name, "--lan-tls") == "true", name
        assert dep.one(name, "--tls-ca") == f"{CERTS_DIR}/ca.pem", name


def test_every_daemon_has_its_lans_key_and_would_start_beyond_loopback(dep):
    """Every daemon listens on 0.0.0.0: with its flags it passes the check that makes an
    unauthenticated daemon refuse to start (dedupnet/service/exposure.py)."""
    for name in dep.of_role("center") + dep.of_role("local"):
        n = dep.one(name, "--network")
        assert dep.one(name, "--lan-key-file") == f"{CERTS_DIR}/lan-{n}.key", name
        argv = argv_of(dep.services[name])
        args = build_parser().parse_args(argv[argv.index(dep.role[name]):])
        fields = set(Settings.__dataclass_fields__)
        settings = load_settings(**{k: v for k, v in vars(args).items() if k in fields})
        role = "center" if dep.role[name] == "center" else "host"
        host, port = parse_endpoint(dep.one(name, "--listen"))
        assert check_exposure(settings, role, (str(host), port), has_peers=bool(settings.peers)) is None, name


def test_the_image_lets_the_daemons_user_own_the_certs_volume():
    text = (COMPOSE_DIR / "Dockerfile").read_text()
    assert "chown dedupnet /certs" in text


# -- the image -------------------------------------------------------------------------


def test_dedupnet_services_build_the_project_image(dep):
    root = COMPOSE_DIR.parent
    for name in dep.of_role("center") + dep.of_role("local"):
        build = dep.services[name]["build"]
        context = (COMPOSE_DIR / build["context"]).resolve()
        assert context == root, f"{name}: build context must be the repository root"
        assert (context / build["dockerfile"]).resolve() == COMPOSE_DIR / "Dockerfile", name


def test_dockerfile_installs_the_project_on_python_311():
    lines = [line.strip() for line in (COMPOSE_DIR / "Dockerfile").read_text().splitlines()]
    froms = [line for line in lines if line.upper().startswith("FROM ")]
    assert froms == ["FROM python:3.11-slim"]
    assert any(line.startswith("RUN pip install .") for line in lines)
    root = COMPOSE_DIR.parent
    for line in lines:  # every path the image copies exists in the repository
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (root / src).exists(), f"Dockerfile copies missing {src}"
