"""The handshake, sans I/O: who may register as what, and which compression both ends use.

A connection starts with the client's :class:`~dedupnet.codec.messages.Register`; the
server answers one that offers compression with a :class:`~dedupnet.codec.messages.Welcome`.
The decisions about those two messages are here, apart from sockets, clocks and logs,
so that they can be read in one place and tested without a network (wsproto's
``handshake.py`` keeps the WebSocket handshake the same way). The adapters around it
(:mod:`.server`, :mod:`.client`, :mod:`.connection`) read and write the bytes, keep the
deadlines, and log and count what is decided here.

* :class:`ServerHandshake` judges the first message of an accepted connection: it must
  be a Register, of a role accepted here, from the address the kernel reports (the
  sender is the connection, not the frame), tagged with its own role's key where that
  role has one, and over TLS where the role must use it. :class:`RegisterTags` is the
  decoder's tag check while the role is not known yet.
* :class:`ClientHandshake` makes the Register's compression offer and checks the
  server's Welcome against it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dedupnet.codec.auth import Keyring
from dedupnet.codec.errors import ProtocolError
from dedupnet.codec.messages import COMPRESSIONS, Kind, Message, Register, Welcome

if TYPE_CHECKING:
    from dedupnet.adapters.net.tls import ServerTLS

__all__ = ["Accepted", "ClientHandshake", "Peer", "Refused", "RegisterTags", "ServerHandshake", "kind_name"]

_KIND_NAMES = {kind.value: kind.name.lower() for kind in Kind}


def kind_name(kind: int) -> str:
    """A message kind as counters and log lines name it (``frame``, ``register``, ...)."""
    return _KIND_NAMES.get(kind, "unknown")


class RegisterTags:
    """The decoder's tag check until the Register has said which role (and so which
    keyring) a connection has: a tag must verify under one of the keyrings of the
    accepted roles; an untagged Register passes only if some accepted role has no
    keyring. :attr:`verified` holds the keyrings that verified it."""

    def __init__(self, keyrings: dict[str, Keyring], accept_roles: tuple[str, ...]) -> None:
        self.rings = list({id(k): k for role, k in keyrings.items() if role in accept_roles}.values())
        self.open_roles = any(role not in keyrings for role in accept_roles)
        self.verified: list[Keyring] = []
        self.tagged = False

    @property
    def tag_len_required(self) -> int | None:
        """The tag length every message must have, None if an untagged one may pass."""
        return None if self.open_roles else self.rings[0].tag_len

    def __call__(self, header_and_body: bytes, tag: bytes) -> None:
        self.verified = []
        self.tagged = bool(tag)
        if not tag and self.open_roles:
            return
        error: ProtocolError | None = None
        for ring in self.rings:
            try:
                ring.verify(header_and_body, tag)
            except ProtocolError as exc:
                error = exc if error is None or ring.knows(tag) else error
            else:
                self.verified.append(ring)
        if not self.verified:
            raise error or ProtocolError("message without a tag, and every role here needs one", "bad-tag")


@dataclass(frozen=True)
class Peer:
    """What the server knows of a client before it reads its Register: the address the
    kernel reports, and whether it came over TLS with which verified certificate."""

    ip: str
    tls: bool = False
    cert: dict | None = None


@dataclass(frozen=True)
class Accepted:
    """The Register is accepted. ``keyring``: the one the connection uses from now on
    (None: untagged); ``welcome``: the answer to send before anything else (None when
    the client offered no compression: it gets none); ``compression``: what both ends
    now use (None: plain only)."""

    register: Register
    keyring: Keyring | None
    welcome: Welcome | None
    compression: str | None


@dataclass(frozen=True)
class Refused:
    """The Register (or its absence) is refused: counted ``handshake_failed{reason}``,
    told to the client as an Error of ``error_reason`` with ``text``, and the
    connection closed. ``bad_tag``: it was tagged with another role's key (counted as
    bad input too). ``keyring``: the key to tag the Error with, so that a keyed client
    can read it (None: untagged)."""

    reason: str
    text: str
    error_reason: str
    bad_tag: bool = False
    keyring: Keyring | None = None


class ServerHandshake:
    """The rules of a listener: the roles it accepts, whether a Register's ``IP`` must
    be the connection's source address, the keyring each role's messages must carry,
    and the TLS each role must use. One per listener; :meth:`tags` gives each
    connection its own tag check."""

    def __init__(self, accept_roles: tuple[str, ...] = ("host", "center"), *, verify_source: bool = True,
                 keyrings: dict[str, Keyring | None] | None = None, tls: ServerTLS | None = None,
                 compress: bool = True, timeout: float = 5.0) -> None:
        self.accept_roles = tuple(accept_roles)
        self.verify_source = verify_source
        #: The roles whose messages must be tagged, and with which keyring.
        self.keyrings = {role: ring for role, ring in (keyrings or {}).items() if ring is not None} or None
        self.tls = tls
        self.compress = compress
        #: How long a client has for its Register (only named here, in the refusal).
        self.timeout = timeout

    def tags(self) -> RegisterTags | None:
        """A new connection's tag check until its role is known; None without keyrings."""
        return RegisterTags(self.keyrings, self.accept_roles) if self.keyrings else None

    def judge(self, msg: Message | None, peer: Peer, tags: RegisterTags | None = None) -> Accepted | Refused:
        """The verdict on a connection's first message (None: none came in time)."""
        refused = self._refusal(msg, peer, tags)
        if refused is not None:
            if tags is not None and tags.verified and not refused.bad_tag:
                refused = dataclasses.replace(refused, keyring=tags.verified[0])
            return refused
        assert type(msg) is Register
        keyring = self.keyrings.get(msg.role) if self.keyrings else None
        if msg.compress is None:  # only a client that offered gets a Welcome
            return Accepted(msg, keyring, None, None)
        # This side's preference (COMPRESSIONS' order) among what the client offered.
        chosen = next((name for name in COMPRESSIONS if self.compress and name in msg.compress), None)
        return Accepted(msg, keyring, Welcome(() if chosen is None else (chosen,)), chosen)

    def _refusal(self, msg: Message | None, peer: Peer, tags: RegisterTags | None) -> Refused | None:
        if msg is None:
            return _refused("timeout", f"no register message within {self.timeout:g} s")
        if type(msg) is not Register:
            return _refused("not-register", f"the first message must be a register, got {kind_name(msg.KIND)}")
        if msg.role not in self.accept_roles:
            return _refused("bad-role", f"role {msg.role!r} is not accepted here "
                                        f"(accepting {', '.join(self.accept_roles)})")
        if self.verify_source and msg.IP != peer.ip:
            return _refused("source-mismatch", f"register IP {msg.IP} is not the connection's source address {peer.ip}")
        keyrings = self.keyrings
        if keyrings and tags is not None and msg.role in keyrings and keyrings[msg.role] not in tags.verified:
            # Tagged with another role's key (or untagged, where another role needs no key).
            return Refused("bad-input", f"register of role {msg.role!r} is not tagged with that role's key",
                           "bad-tag", bad_tag=True)
        if self.tls is not None:
            refused = self.tls.check(peer.tls, peer.cert, msg.role, msg.network, msg.IP)
            if refused:
                return _refused(*refused)
        return None


def _refused(reason: str, text: str) -> Refused:
    return Refused(reason, text, reason)


class ClientHandshake:
    """The client's side: the Register as sent (with the compression offer made or
    withdrawn) and what the server's Welcome turned on."""

    def __init__(self, register: Register, compress: bool) -> None:
        if not compress:
            register = dataclasses.replace(register, compress=None)
        elif register.compress is None:
            register = dataclasses.replace(register, compress=COMPRESSIONS)
        self.register = register
        self.offered = register.compress is not None
        self.welcomed = False

    def welcome(self, msg: Welcome) -> str | None:
        """The compression the server's Welcome turns on (None: plain only). A
        ProtocolError if we did not offer, already had one, or it names a compression
        we did not offer."""
        if not self.offered or self.welcomed:
            raise unexpected_welcome()
        self.welcomed = True
        offered = self.register.compress or ()
        for name in msg.compress:
            if name not in offered or name not in COMPRESSIONS:
                raise ProtocolError(f"welcome chose compression {name!r}, which was not offered",
                                    "unexpected-welcome")
        return msg.compress[0] if msg.compress else None


def unexpected_welcome() -> ProtocolError:
    """A Welcome on a connection that made no offer (the server side, or a client that
    sent its Register by other means)."""
    return ProtocolError("welcome from a peer that was not asked for one", "unexpected-welcome")
