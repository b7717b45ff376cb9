"""Opening a daemon's TCP listeners, where a failure is the operator's to fix.

An address already in use, or one that is not this machine's, cannot heal by retrying:
it becomes a :class:`~dedupnet.codec.errors.SettingsError` that names the address and
the flag it came from, so the command stops with that one line instead of a trace
through the daemon's nursery."""

from __future__ import annotations

import socket

import trio

from dedupnet.codec.errors import SettingsError


async def open_listeners(host: str | None, port: int, what: str) -> list[trio.SocketListener]:
    """``trio.open_tcp_listeners(port, host=host)``; ``what`` names the setting (``--listen``)."""
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        address = f"[{host}]" if host and ":" in host else (host or "*")
        raise SettingsError(f"cannot listen on {address}:{port} ({what}): {exc.strerror or exc}") from exc


def check_free(host: str | None, port: int, what: str) -> None:
    """Bind ``host:port`` for a moment, as :func:`open_listeners` will (SO_REUSEADDR),
    and let it go: an address in use, or not this machine's, is said before the daemon
    starts its Redis, not after a page of lines about starting and stopping it (port 0:
    whether the address is this machine's). A port taken between this check and the
    daemon's bind is still reported, by :func:`open_listeners`."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return  # a name that does not resolve: open_listeners says so
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                shown = f"[{host}]" if host and ":" in host else (host or "*")
                raise SettingsError(f"cannot listen on {shown}:{port} ({what}): {exc.strerror or exc}") from exc
