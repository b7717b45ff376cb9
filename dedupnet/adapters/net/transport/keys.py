"""Key rotation without a restart: the key files of the keyrings in use, re-read."""

from __future__ import annotations

import trio

from dedupnet.codec.auth import Keyring
from dedupnet.adapters.monitor.metrics import Counters

__all__ = ["watch_keyrings"]


async def watch_keyrings(keyrings: list[Keyring | None], counters: Counters, interval: float = 1.0) -> None:
    """Re-read the key files of ``keyrings`` every ``interval`` seconds (runs until
    cancelled): rotation without a restart (dedupnet/codec/auth.py). A poll rather than
    SIGHUP: it works the same for a daemon under systemd, in a container whose key is a
    mounted secret, and for the many daemons of one ``dedupnet sim`` process."""
    rings = list({id(r): r for r in keyrings if r is not None and r.path is not None}.values())
    if not rings:
        return
    while True:
        await trio.sleep(interval)
        for ring in rings:
            errors = ring.reload_errors
            if ring.reload():
                counters.inc("key_reloads")
            if ring.reload_errors != errors:
                counters.inc("key_reload_failed")
