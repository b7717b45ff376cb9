"""Opening a daemon's TCP listeners, where a failure is the operator's to fix.

An address already in use, or one that is not this machine's, cannot heal by retrying:
it becomes a :class:`~dedupnet.codec.errors.SettingsError` that names the address and
the flag it came from, so the command stops with that one line instead of a trace
through the daemon's nursery."""

from __future__ import annotations

import trio

from dedupnet.codec.errors import SettingsError


async def open_listeners(host: str | None, port: int, what: str) -> list[trio.SocketListener]:
    """``trio.open_tcp_listeners(port, host=host)``; ``what`` names the setting (``--listen``)."""
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        address = f"[{host}]" if host and ":" in host else (host or "*")
        raise SettingsError(f"cannot listen on {address}:{port} ({what}): {exc.strerror or exc}") from exc
