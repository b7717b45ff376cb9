"""Safe by default: a daemon that listens where other machines can reach it
authenticates who talks to it, or the operator says ``--insecure`` (docs/DEPLOY.md,
docs/DECISIONS.md "Safe by default").

The model is Redis's protected mode: on loopback everything works as before with
nothing to set up (a one-machine deployment, ``dedupnet sim``, the tests); on any
other address a daemon without authentication for a role it serves does not start,
and says in one line what to do. A LAN host could otherwise register without a key and
take admitted URLs as tasks it never crawls, and anything on a configured peer's
addresses could register as that peer center and mark every URL it is asked about as
seen: either way URLs are lost without a trace.

What each role needs:

* the LAN side (a center's hosts and status clients, a host's status port): a LAN key
  (``lan_key_file``). ``lan_tls`` alone does not do: a host certificate is optional.
* a center's peers, when it has any: TLS (``tls_cert``, ``tls_key``, ``tls_ca``). A
  peer key (``peer_key_file``) alone does not do: every center holds the same key, so
  any of them could pose as another network, whereas a certificate names one network.
"""

from __future__ import annotations

import ipaddress
import os
import stat
import logging
import socket

import trio

from dedupnet.codec.errors import SettingsError
from dedupnet.service.config import Settings

log = logging.getLogger("dedupnet.service.exposure")

#: Seconds between two warnings of a daemon running with ``--insecure``.
INSECURE_WARNING_INTERVAL = 60.0


class Unprotected(SettingsError):
    """A daemon would listen beyond loopback without authentication (the message is
    the one line the command prints, exit status 2)."""


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (an address or a name; None or a wildcard: every address) is
    reachable from this machine only. A name counts if every address it resolves to
    is loopback."""
    if not host or host in ("0.0.0.0", "::", "*"):
        return False
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def missing_authentication(settings: Settings, role: str, has_peers: bool = False) -> list[str]:
    """What a daemon of ``role`` (``center`` or ``host``) lacks to authenticate the
    roles it serves; empty if nothing."""
    missing = []
    if settings.lan_key_file is None:
        missing.append("a LAN key (lan_key_file)")
    if role == "center" and has_peers and None in (settings.tls_cert, settings.tls_key, settings.tls_ca):
        missing.append("TLS between centers (tls_cert, tls_key, tls_ca)")
    return missing


def check_exposure(settings: Settings, role: str, listen: tuple[str | None, int], *,
                   has_peers: bool = False) -> str | None:
    """Before a daemon starts: None if it listens on loopback only or authenticates
    every role it serves; the warning to repeat while it runs if it does not but
    ``settings.insecure`` says so; else :class:`Unprotected`."""
    host, port = listen
    if is_loopback(host):
        return None
    missing = missing_authentication(settings, role, has_peers)
    if not missing:
        return None
    where = f"{host or '*'}:{port}"
    network = f" --networks {settings.network}" if settings.network else ""
    if settings.insecure:
        return (f"--insecure: listening on {where}, beyond loopback, without {' or '.join(missing)}: "
                f"anyone who can reach it can register as a host or a peer and lose URLs; `dedupnet certs{network}` "
                "prints the settings that close it")
    raise Unprotected(f"refusing to listen on {where}, beyond loopback, without {' or '.join(missing)}: "
                      f"run `dedupnet certs{network}` and add the settings it prints, "
                      "or pass --insecure to run without (docs/DEPLOY.md)")


def check_frontier_exposure(settings: Settings, listen: tuple[str, int]) -> str | None:
    """As :func:`check_exposure`, for a host's URLFrontier service: it authenticates no
    client (the URLFrontier API has no means to), and a client can take every task of
    the host and mark it crawled. So beyond loopback only with ``--insecure`` (and then
    only on a network where every machine is the operator's)."""
    host, port = listen
    if is_loopback(host):
        return None
    where = f"{host}:{port}"
    if settings.insecure:
        return (f"--insecure: the URLFrontier service listens on {where}, beyond loopback, without "
                "authentication: anyone who can reach it can take this host's tasks and mark them crawled")
    raise Unprotected(f"refusing to serve the URLFrontier API on {where}, beyond loopback: it authenticates no "
                      "client; serve it on 127.0.0.1 (a crawler on this machine), or pass --insecure on a network "
                      "only your crawlers reach (docs/FRONTIER.md)")


async def warn_while_running(text: str, interval: float = INSECURE_WARNING_INTERVAL) -> None:
    """Log ``text`` at WARNING now and every ``interval`` seconds until cancelled: an
    insecure daemon says so in every page of its log, not only at start."""
    while True:
        log.warning("%s", text)
        await trio.sleep(interval)


#: The settings that name a secret: a file anyone on the machine may read gives its key away.
SECRET_FILES = ("lan_key_file", "peer_key_file", "tls_key")


def warn_open_secrets(settings: Settings) -> list[str]:
    """One WARNING per secret file that every user may read (as ssh says of a private
    key), at start: the daemon runs all the same, since refusing would stop a deployment
    over a mode bit, but the operator learns it once, with the command that fixes it.
    Readable by the file's group is fine: the guide's daemons read theirs that way."""
    lines = []
    for name in SECRET_FILES:
        path = getattr(settings, name, None)
        try:
            mode = os.stat(path).st_mode if path else 0
        except OSError:
            continue  # a missing file is reported where it is read
        if mode & 0o007:  # the group may read it: the guide gives the daemons' group the files it needs
            lines.append(f"{name} {path} is readable by every user of this machine (mode {stat.S_IMODE(mode):04o}): "
                         f"anyone here can take the key; chmod o-rwx {path}")
            log.warning("%s", lines[-1])
    return lines
