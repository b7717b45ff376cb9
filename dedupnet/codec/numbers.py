"""The frame's ``number`` (paper §2.1): unique in the whole system, ordered, self-describing.

Layout of the unsigned 63-bit integer (so it fits a signed 64-bit field in any
language and in Redis)::

    bit 62 ........ 32 | 31 ...... 16 | 15 ....... 0
        sequence (31)  | network (16) | host (16)

* ``network`` — the LAN's configured id (1..65535);
* ``host`` — the host's id within that LAN, by default the host part of its IP
  under the LAN's netmask (so it is unique inside one LAN of up to /16);
* ``sequence`` — a per-host counter persisted in that host's Redis (``INCRBY``),
  so it survives restarts and is never reused while the store lives.

Numbers compare as plain integers: sequence first, then network, then host. That
total order is what the exact mode's "lower number wins" tie-break uses (see
docs/PROTOCOL.md); any total order every center computes the same way would do.
"""

from __future__ import annotations

import ipaddress

SEQUENCE_BITS = 31
NETWORK_BITS = 16
HOST_BITS = 16
MAX_SEQUENCE = (1 << SEQUENCE_BITS) - 1
MAX_NETWORK = (1 << NETWORK_BITS) - 1
MAX_HOST = (1 << HOST_BITS) - 1
MAX_NUMBER = (1 << (SEQUENCE_BITS + NETWORK_BITS + HOST_BITS)) - 1


def check_network(value: object, what: str = "network") -> int:
    """``value`` if it is a network id: an integer 1..65535 (0 means "no network", as a
    control client registers, and more does not fit a number). ValueError names ``what``."""
    if type(value) is not int or not 1 <= value <= MAX_NETWORK:
        raise ValueError(f"{what} must be a network id within 1..{MAX_NETWORK}, not {value!r}")
    return value


def make_number(network: int, host: int, sequence: int) -> int:
    """Pack the three parts; each must fit its field (ValueError otherwise)."""
    if not 0 <= network <= MAX_NETWORK:
        raise ValueError(f"network id {network} outside 0..{MAX_NETWORK}")
    if not 0 <= host <= MAX_HOST:
        raise ValueError(f"host id {host} outside 0..{MAX_HOST}")
    if not 0 <= sequence <= MAX_SEQUENCE:
        raise ValueError(f"sequence {sequence} outside 0..{MAX_SEQUENCE}")
    return (sequence << (NETWORK_BITS + HOST_BITS)) | (network << HOST_BITS) | host


def split_number(number: int) -> tuple[int, int, int]:
    """Return ``(network, host, sequence)`` of a number made by :func:`make_number`."""
    if not 0 <= number <= MAX_NUMBER:
        raise ValueError(f"number {number} outside 0..{MAX_NUMBER}")
    return (
        (number >> HOST_BITS) & MAX_NETWORK,
        number & MAX_HOST,
        number >> (NETWORK_BITS + HOST_BITS),
    )


def host_id_from_ip(ip: str, lan: str) -> int:
    """The host part of ``ip`` inside ``lan`` (CIDR), which must hold the address.

    A LAN wider than /16 could give two hosts the same id; such deployments set
    the host id explicitly instead (ValueError here tells them so).
    """
    addr = ipaddress.ip_address(ip)
    net = ipaddress.ip_network(lan, strict=False)
    if addr not in net:
        raise ValueError(f"{ip} is not in LAN {lan}")
    host_bits = net.max_prefixlen - net.prefixlen
    if host_bits > HOST_BITS:
        raise ValueError(f"LAN {lan} is wider than /{net.max_prefixlen - HOST_BITS}: set the host id explicitly")
    return int(addr) - int(net.network_address)
