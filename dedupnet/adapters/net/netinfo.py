"""A host's own address and LAN, as its network interfaces report them (netifaces).

Paper gap 5: the IP is the host's identity in every frame, and the LAN (address +
netmask) decides which network an IP belongs to. Every value can be overridden
(``--ip``, ``--lan``); by default:

* a local host: the address the kernel would use to reach its center, and the
  netmask of the interface that holds it (:func:`detect`);
* a center listening on one address: that address and its interface's netmask;
* a center listening on every address (``--listen 0.0.0.0:PORT``): its IP is the
  address it reaches the other centers from (what they see), and its LAN the one
  interface that is *not* the way to them (:func:`center_lan`): a center is its
  LAN's gateway, with one leg on the LAN and one on the WAN. A center with a
  single interface has its LAN there; one with several candidates must be told
  (``--lan``), it does not guess.
"""

from __future__ import annotations

import ipaddress
import socket

import netifaces


def source_ip_towards(host: str, port: int = 9) -> str:
    """The local address the kernel picks to reach ``host`` (a UDP ``connect`` sends nothing)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return s.getsockname()[0]


def lan_of(ip: str) -> str:
    """The CIDR of the interface that holds ``ip`` (ValueError if no interface does)."""
    addr = ipaddress.ip_address(ip)
    family = netifaces.AF_INET6 if addr.version == 6 else netifaces.AF_INET
    for name in netifaces.interfaces():
        for entry in netifaces.ifaddresses(name).get(family, []):
            if entry.get("addr", "").split("%")[0] == ip and entry.get("netmask"):
                mask = entry["netmask"].rsplit("/", 1)[-1]  # IPv6 masks come as "ffff:...::/64"
                return str(ipaddress.ip_network(f"{ip}/{mask}", strict=False))
    # Linux answers for all of 127.0.0.0/8 while only 127.0.0.1 is on lo.
    if addr.is_loopback and addr.version == 4:
        return str(ipaddress.ip_network(f"{ip}/24", strict=False))
    raise ValueError(f"no network interface holds {ip}")


def _interface_addresses(version: int):
    """``(interface, address, network, netifaces entry)`` of every address of this machine
    (this network namespace) of IP ``version``, loopback and link-local ones left out."""
    family = netifaces.AF_INET6 if version == 6 else netifaces.AF_INET
    for name in netifaces.interfaces():
        for entry in netifaces.ifaddresses(name).get(family, []):
            addr, mask = entry.get("addr", "").split("%")[0], entry.get("netmask")
            if not addr or not mask:
                continue
            ip = ipaddress.ip_address(addr)
            if ip.is_loopback or ip.is_link_local:
                continue
            yield name, addr, ipaddress.ip_network(f"{addr}/{mask.rsplit('/', 1)[-1]}", strict=False), entry


def interface_networks(version: int = 4) -> list[tuple[str, str, str]]:
    """``(interface, address, CIDR)`` of every address of this machine (this network
    namespace) of IP ``version``, loopback and link-local ones left out."""
    return [(name, addr, str(net)) for name, addr, net, _ in _interface_addresses(version)]


LIMITED_BROADCAST = "255.255.255.255"


def broadcast_targets(ip: str | None = None, lan: str | None = None) -> list[tuple[str, str, str]]:
    """``(interface, address, broadcast address)`` of the IPv4 addresses a host looks for
    its center from (LAN discovery, dedupnet/adapters/net/discovery.py): ``ip``'s only if given, else
    those inside ``lan`` if given, else every one (loopback and link-local left out).

    The broadcast address is the one the interface is configured with. An address added
    without one (``ip addr add 10.1.0.5/24`` without ``brd +``: netifaces then reports
    the address itself) gets the limited broadcast 255.255.255.255 instead: sent from a
    socket bound to that address, the kernel puts it on that address's interface, where
    a directed broadcast the interface does not know would be sent as unicast."""
    net = None if lan is None else ipaddress.ip_network(lan, strict=False)
    found = []
    for name, addr, network, entry in _interface_addresses(4):
        if (ip is not None and addr != ip) or (net is not None and ipaddress.ip_address(addr) not in net):
            continue
        broadcast = entry.get("broadcast")
        if not broadcast or broadcast == addr or network.prefixlen >= 31:
            broadcast = LIMITED_BROADCAST
        found.append((name, addr, broadcast))
    return found


def center_lan(ip: str) -> str:
    """The LAN of a center whose identity ``ip`` is the address it reaches its peers
    from: the one interface network that does not hold ``ip`` (the gateway's other leg);
    ``ip``'s own network if it has no other (or ``ip`` is a loopback address, everything
    on one machine). ValueError naming the candidates if there are several."""
    addr = ipaddress.ip_address(ip)
    if addr.is_loopback:
        return lan_of(ip)
    others = [n for n in interface_networks(addr.version) if n[1] != ip]
    nets = sorted({cidr for _, _, cidr in others} - {lan_of(ip)})
    if not nets:
        return lan_of(ip)
    if len(nets) == 1:
        return nets[0]
    listed = ", ".join(f"{name} {a} ({cidr})" for name, a, cidr in others)
    raise ValueError(f"cannot tell this center's LAN: besides {ip} (towards the peers) it has {listed}; "
                     f"give --lan CIDR (or --listen on its LAN address)")


def sole_address(version: int = 4) -> str | None:
    """This machine's only non-loopback address, None if it has none; ValueError if several."""
    nets = interface_networks(version)
    if len(nets) > 1:
        listed = ", ".join(f"{name} {a}" for name, a, _ in nets)
        raise ValueError(f"several addresses could be this center's ({listed}); give --ip or --lan")
    return nets[0][1] if nets else None


def address_in(cidr: str) -> str:
    """This machine's address inside network ``cidr`` (ValueError if it has none)."""
    net = ipaddress.ip_network(cidr, strict=False)
    for _, addr, _ in interface_networks(net.version):
        if ipaddress.ip_address(addr) in net:
            return addr
    raise ValueError(f"no network interface has an address in {cidr}")


def detect(center_host: str) -> tuple[str, str]:
    """``(ip, lan)`` of this host as seen towards the center."""
    ip = source_ip_towards(center_host)
    return ip, lan_of(ip)
