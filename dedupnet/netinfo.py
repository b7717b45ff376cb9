"""A host's own address and LAN, as its network interfaces report them (netifaces).

Paper gap 5: the IP is the host's identity in every frame, and the LAN (address +
netmask) decides which network an IP belongs to. By default both come from the
interface the kernel would use to reach the center; every value can be overridden.
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


def detect(center_host: str) -> tuple[str, str]:
    """``(ip, lan)`` of this host as seen towards the center."""
    ip = source_ip_towards(center_host)
    return ip, lan_of(ip)
