"""LAN discovery: a host started with ``--center auto`` finds its center by a UDP broadcast.

Why: the paper's hosts find each other by broadcast on their LAN (§2.3 "broadcast it to
the LAN's hosts"), but it says nothing of how a host learns its center (gap 5). Explicit
``--center HOST:PORT`` stays the default; discovery lets an operator add a host to a LAN
without knowing, or editing, its center's address or network id.

How: the host broadcasts a *query* to UDP port ``discovery_port`` (default
:data:`DEFAULT_PORT`) on its LAN's broadcast address (netifaces, :func:`dedupnet.adapters.net.netinfo.
broadcast_targets`); every center listening there whose LAN holds the query's source
address (and whose network is the one asked for, if any) unicasts an *answer* back:
its network id, the ``host:port`` of its TCP listener and its LAN. The host then
connects there as if it had been given ``--center``. Queries are repeated with back-off
until an answer comes or an overall deadline passes (:func:`find_center`), which ends in
a :class:`DiscoveryError` that says what was tried and what came back.

Datagram (one per UDP packet, at most :data:`MAX_DATAGRAM` bytes; integers big-endian)::

    offset  size  field
         0     4  magic  b"DNDS" (a stream frame starts "DN", 0x01: never confused)
         4     1  version  1
         5     1  type  1 = query, 2 = answer
         6     1  tag length  0 without a key, 18 with one (dedupnet/codec/auth.py)
         7     1  reserved  0
         8     n  body: a JSON object (orjson), fields below, no others
       8+n    18  tag, if any: key id (uint16) + HMAC-SHA256(secret, header + body)[:16]

    query   {"nonce": 32 lowercase hex digits, "network": 1..65535 (optional)}
    answer  {"nonce": the query's, "network": 1..65535, "center": "IPv4:port", "lan": "CIDR"}

Authentication (``lan_key_file``): the host tags its query and accepts only answers
tagged with a LAN key; the center accepts only tagged queries. The answer's tag covers
the query's nonce (16 random bytes, fresh for each :func:`find_center`), so a forged
answer fails its tag (``bad-tag``) and a recorded genuine one replayed to a later
query fails the nonce (``nonce``); both are counted and never followed. The tag also
covers the address the host will connect to, which is why that address is in the body
rather than taken from the datagram's source. Without a key discovery is as trusting
as the LAN's TCP without one (the source address, gap 2): anyone on the LAN can answer.

Bad input: every datagram that does not decode, verify or fit is counted
(``discovery_rejected{reason}``) and logged at most once per :data:`LOG_EVERY` seconds
per reason; valid datagrams that are not for this daemon are counted
(``discovery_ignored{reason}``). Nothing a datagram holds can stop either side.

The codec (:func:`encode`, :func:`decode`) and the two decision makers
(:class:`Responder` for a center, :class:`Search` for a host) are sans-I/O;
:func:`serve_discovery` and :func:`find_center` are their trio UDP adapters.
IPv4 only: IPv6 has no broadcast (multicast would be its way; not implemented).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import random
import re
import secrets
import socket
import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
import trio

from dedupnet.codec.auth import TAG_LEN, Keyring
from dedupnet.codec.backoff import Backoff
from dedupnet.codec.errors import DiscoveryError, ProtocolError
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.net.netinfo import address_in

__all__ = [
    "DEFAULT_PORT",
    "MAX_DATAGRAM",
    "Query",
    "Answer",
    "encode",
    "decode",
    "Responder",
    "Search",
    "Target",
    "DiscoveryError",
    "center_address",
    "serve_discovery",
    "find_center",
]

log = logging.getLogger("dedupnet.adapters.net.discovery")

DEFAULT_PORT = 7799
MAGIC = b"DNDS"
VERSION = 1
QUERY, ANSWER = 1, 2
HEADER = struct.Struct(">4sBBBB")  # magic, version, type, tag length, reserved
#: Far above the largest valid datagram (146 bytes with a tag), far below one
#: Ethernet payload: a datagram is never fragmented, and a bigger one is garbage.
MAX_DATAGRAM = 512
NONCE_BYTES = 16
#: Seconds between two log lines about bad datagrams of one reason (a flood must not
#: flood the log; the counters count every one).
LOG_EVERY = 5.0
#: A center's answers a second (and burst): a LAN of hundreds of hosts booting at once
#: is answered within seconds, a query flood cannot make the center a flood source.
ANSWER_RATE = 200.0
#: Between two sends of the host's query. Jittered: a LAN's hosts started together do
#: not ask in step.
RESEND = Backoff(first=0.25, cap=2.0, jitter=0.25)
#: How long the host keeps listening after the first answer for the answers of other centers.
SETTLE = 0.25
#: A receive error is not about the next datagram; if it repeats, this bounds the loop.
RECEIVE_ERROR_PAUSE = 0.01

_NONCE = re.compile(r"[0-9a-f]{32}")
_WILDCARDS = ("", "0.0.0.0", "::")


# -- the codec (sans-I/O) --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Query:
    """A host looking for its center (of ``network``, or of whichever network answers)."""

    nonce: str
    network: int | None = None

    TYPE: ClassVar[int] = QUERY

    def to_json(self) -> dict[str, Any]:
        return {"nonce": self.nonce} if self.network is None else {"nonce": self.nonce, "network": self.network}


@dataclass(frozen=True, slots=True)
class Answer:
    """A center's answer to the query with ``nonce``: connect to ``center``."""

    nonce: str
    network: int
    center: str  # "IPv4:port" of the center's TCP listener
    lan: str

    TYPE: ClassVar[int] = ANSWER

    def to_json(self) -> dict[str, Any]:
        return {"nonce": self.nonce, "network": self.network, "center": self.center, "lan": self.lan}

    @property
    def endpoint(self) -> tuple[str, int]:
        host, _, port = self.center.rpartition(":")
        return host, int(port)


def encode(message: Query | Answer, keyring: Keyring | None = None) -> bytes:
    """One datagram, tagged with ``keyring``'s sending key if given."""
    body = orjson.dumps(message.to_json())
    data = HEADER.pack(MAGIC, VERSION, message.TYPE, TAG_LEN if keyring else 0, 0) + body
    if keyring is not None:
        data += keyring.tag(data)
    if len(data) > MAX_DATAGRAM:  # a bug of ours: nothing valid comes near
        raise ValueError(f"discovery datagram of {len(data)} bytes exceeds {MAX_DATAGRAM}")
    return data


def decode(data: bytes, keyring: Keyring | None = None) -> Query | Answer:
    """The message of one datagram; :class:`ProtocolError` whose ``reason`` is the counter
    label: ``too-large``, ``truncated``, ``bad-magic``, ``bad-version``, ``bad-type``,
    ``bad-header``, ``bad-tag``, ``bad-json`` or ``schema``. With ``keyring`` the tag is
    checked before the body is parsed; without one a tag is ignored (as on the wire)."""
    if len(data) > MAX_DATAGRAM:
        raise ProtocolError(f"datagram of more than {MAX_DATAGRAM} bytes", "too-large")
    if len(data) < HEADER.size:
        raise ProtocolError(f"datagram of {len(data)} bytes, shorter than the {HEADER.size}-byte header", "truncated")
    magic, version, kind, tag_len, reserved = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ProtocolError(f"datagram does not start with {MAGIC!r}: not dedupnet discovery", "bad-magic")
    if version != VERSION:
        raise ProtocolError(f"discovery version {version}, this daemon speaks {VERSION}", "bad-version")
    if kind not in (QUERY, ANSWER):
        raise ProtocolError(f"discovery datagram of unknown type {kind}", "bad-type")
    if reserved:
        raise ProtocolError("reserved header byte is not zero", "bad-header")
    end = len(data) - tag_len
    if end < HEADER.size:
        raise ProtocolError(f"datagram shorter than its {tag_len}-byte tag", "truncated")
    if keyring is not None:
        keyring.verify(data[:end], data[end:])  # ProtocolError "bad-tag"
    try:
        obj = orjson.loads(data[HEADER.size:end])
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"discovery body is not JSON: {exc}", "bad-json") from None
    return _query(obj) if kind == QUERY else _answer(obj)


def _fields(obj: Any, what: str, required: set[str], optional: frozenset[str] = frozenset()) -> dict:
    if type(obj) is not dict:
        raise ProtocolError(f"discovery {what}: body must be a JSON object", "schema")
    missing, extra = required - obj.keys(), obj.keys() - required - optional
    if missing or extra:
        raise ProtocolError(f"discovery {what}: missing {sorted(missing)}, unexpected {sorted(extra)[:8]}", "schema")
    if type(obj["nonce"]) is not str or not _NONCE.fullmatch(obj["nonce"]):
        raise ProtocolError(f"discovery {what}: 'nonce' must be {2 * NONCE_BYTES} lowercase hex digits", "schema")
    network = obj.get("network")
    if "network" in obj and (type(network) is not int or not 1 <= network <= 65535):  # null too
        raise ProtocolError(f"discovery {what}: 'network' must be an integer 1..65535", "schema")
    return obj


def _query(obj: Any) -> Query:
    obj = _fields(obj, "query", {"nonce"}, frozenset({"network"}))
    return Query(obj["nonce"], obj.get("network"))


def _answer(obj: Any) -> Answer:
    obj = _fields(obj, "answer", {"nonce", "network", "center", "lan"})
    center, lan = obj["center"], obj["lan"]
    try:
        if type(center) is not str or type(lan) is not str or len(center) > 32 or len(lan) > 32:
            raise ValueError("not strings of at most 32 characters")
        host, sep, port = center.rpartition(":")
        if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"'center' must be IPv4:port, got {center!r}")
        center = f"{ipaddress.IPv4Address(host)}:{int(port)}"
        lan = str(ipaddress.IPv4Network(lan, strict=False))
    except ValueError as exc:
        raise ProtocolError(f"discovery answer: {exc}", "schema") from None
    return Answer(obj["nonce"], obj["network"], center, lan)


class _LogEvery:
    """One warning per reason per :data:`LOG_EVERY` seconds, saying how many it stands for."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}
        self.unlogged: Counter[str] = Counter()

    def warn(self, reason: str, now: float, text: str, *args: object) -> None:
        self.unlogged[reason] += 1
        if now - self.last.get(reason, -LOG_EVERY) >= LOG_EVERY:
            log.warning(text + " (%d of them since the last report)", *args, self.unlogged.pop(reason))
            self.last[reason] = now


# -- a center's side (sans-I/O) --------------------------------------------------------
class Responder:
    """What a center answers: a query from inside its ``lan``, for its ``network`` or for
    any, gets ``center`` (where its TCP listener is reached from the LAN); everything
    else is counted and dropped. ``keyring``: the LAN's (reloaded in place when the key
    file changes), None for an unauthenticated LAN."""

    def __init__(self, network: int, lan: str, center: str, keyring: Keyring | None, counters: Counters,
                 rate: float = ANSWER_RATE) -> None:
        try:  # what a host would refuse (an IPv6 LAN, a host name), refused here, at start
            _answer(Answer("0" * 2 * NONCE_BYTES, network, center, lan).to_json())
        except ProtocolError as exc:
            raise ValueError(f"cannot announce center {center} of LAN {lan}: {exc} (discovery is IPv4 only)") from None
        self.network, self.lan, self.center = network, lan, center
        self._net = ipaddress.ip_network(lan, strict=False)
        self.keyring = keyring
        self.counters = counters
        self.rate = rate
        self._tokens, self._at = rate, -float("inf")
        self._log = _LogEvery()

    def handle(self, data: bytes, source: str, now: float) -> bytes | None:
        """The answer datagram to send back to ``source``, or None."""
        try:
            query = decode(data, self.keyring)
        except ProtocolError as exc:
            self.counters.inc("discovery_rejected", reason=exc.reason)
            self._log.warn(exc.reason, now, "discovery: rejected a datagram from %s: %s: %s", source, exc.reason, exc)
            return None
        if not isinstance(query, Query):
            return self._ignore("unexpected", source)
        if ipaddress.ip_address(source) not in self._net:
            return self._ignore("not-in-lan", source)
        if query.network not in (None, self.network):
            return self._ignore("other-network", source)
        self._tokens = min(self.rate, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return self._ignore("rate", source)
        self._tokens -= 1
        self.counters.inc("discovery_answered")
        log.info("discovery: told %s that the center of network %d is at %s", source, self.network, self.center)
        return encode(Answer(query.nonce, self.network, self.center, self.lan), self.keyring)

    def _ignore(self, reason: str, source: str) -> None:
        self.counters.inc("discovery_ignored", reason=reason)
        log.debug("discovery: ignored a datagram from %s (%s)", source, reason)


def center_address(listen_host: str | None, ip: str, lan: str, port: int) -> str:
    """``host:port`` a center tells its LAN's hosts: its ``--listen`` address, or, listening
    on every address, its own address in its LAN (a center on two legs has its identity
    ``ip`` on the WAN one), else ``ip``."""
    host = listen_host or ip
    if host in _WILDCARDS:
        try:
            host = address_in(lan)
        except ValueError:
            host = ip
    return f"{host}:{port}"


async def serve_discovery(responder: Responder, port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Answer discovery queries on UDP ``port`` until cancelled; ``started`` with the
    bound port, or None if the port cannot be bound (logged and counted
    ``discovery_failed{reason="bind"}``: a center without discovery still serves its
    hosts). It binds every address (``0.0.0.0``) because Linux delivers a broadcast only
    to sockets bound to the wildcard or to the broadcast address itself, and with
    SO_REUSEADDR, so several centers on one machine all hear a broadcast (a unicast
    query reaches one of them)."""
    with trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            await sock.bind(("0.0.0.0", port))
        except OSError as exc:
            responder.counters.inc("discovery_failed", reason="bind")
            log.error("discovery off: cannot bind UDP port %d (%s); hosts need --center %s", port, exc,
                      responder.center)
            task_status.started(None)
            return
        bound = sock.getsockname()[1]
        log.info("discovery: answering on UDP port %d for network %d (LAN %s): center %s%s", bound,
                 responder.network, responder.lan, responder.center, ", LAN key required" if responder.keyring else "")
        task_status.started(bound)
        while True:
            try:
                data, (source, source_port, *_) = await sock.recvfrom(MAX_DATAGRAM + 1)
            except OSError as exc:  # e.g. an ICMP error surfacing: nothing to do with the next datagram
                responder.counters.inc("discovery_failed", reason="receive")
                log.debug("discovery: receive failed: %s", exc)
                await trio.sleep(RECEIVE_ERROR_PAUSE)
                continue
            reply = responder.handle(data, source, trio.current_time())
            if reply is not None:
                try:
                    await sock.sendto(reply, (source, source_port))
                except OSError as exc:
                    responder.counters.inc("discovery_failed", reason="send")
                    log.warning("discovery: cannot answer %s:%d: %s", source, source_port, exc)


# -- a host's side ---------------------------------------------------------------------
class Search:
    """One host's search for its center: the query (with a fresh nonce) and what came
    back. :meth:`receive` takes each datagram; :attr:`found` holds the distinct valid
    answers, :attr:`rejected` what was refused by reason (also counted
    ``discovery_rejected{reason}``; a bad answer is never followed)."""

    def __init__(self, network: int | None = None, keyring: Keyring | None = None, counters: Counters | None = None,
                 nonce: str | None = None) -> None:
        self.query = Query(nonce or secrets.token_hex(NONCE_BYTES), network)
        self.keyring = keyring
        self.counters = counters or Counters()
        self.datagram = encode(self.query, keyring)
        self.found: dict[tuple[int, str], Answer] = {}
        self.rejected: Counter[str] = Counter()
        self._log = _LogEvery()

    def receive(self, data: bytes, source: str, now: float = 0.0) -> Answer | None:
        """The valid answer ``data`` holds, or None (counted and logged)."""
        try:
            answer = decode(data, self.keyring)
        except ProtocolError as exc:
            return self._reject(exc.reason, source, now, str(exc))
        if not isinstance(answer, Answer):
            return self._reject("unexpected", source, now, "a query, not an answer")
        if answer.nonce != self.query.nonce:
            return self._reject("nonce", source, now, "the answer to another query (replayed, or late from an earlier "
                                                      "search)")
        if self.query.network is not None and answer.network != self.query.network:
            return self._reject("other-network", source, now, f"network {answer.network}, not {self.query.network}")
        self.found.setdefault((answer.network, answer.center), answer)
        return answer

    def _reject(self, reason: str, source: str, now: float, why: str) -> None:
        self.rejected[reason] += 1
        self.counters.inc("discovery_rejected", reason=reason)
        self._log.warn(reason, now, "discovery: rejected an answer from %s: %s: %s", source, reason, why)

    def result(self) -> Answer:
        """The one center that answered; DiscoveryError if several did (give ``--network``)."""
        if len(self.found) != 1:
            listed = ", ".join(f"network {a.network} at {a.center} (LAN {a.lan})" for a in self.found.values())
            raise DiscoveryError(f"several centers answered: {listed}; give --network N (or --center HOST:PORT)")
        return next(iter(self.found.values()))


@dataclass(frozen=True)
class Target:
    """Where queries go (``address``, a broadcast address as a rule) and from which local
    address (``source``; None: the kernel's choice); ``via`` names it in messages."""

    address: str
    source: str | None = None
    via: str = ""


async def find_center(search: Search, targets: Sequence[Target], port: int, timeout: float, *,
                      resend: Backoff = RESEND, settle: float = SETTLE,
                      rng: random.Random | None = None) -> Answer:
    """Send ``search``'s query to every target on UDP ``port``, again after each wait of
    ``resend`` (:data:`RESEND`, drawn from ``rng``), until an answer comes; then
    listen ``settle`` seconds more for other centers (:meth:`Search.result` refuses to
    choose between two). DiscoveryError when ``timeout`` passes with no answer, naming
    what was sent where and what came back; a target that cannot be sent to (no route
    yet: an interface still coming up) is retried like the others."""
    if not targets:
        raise DiscoveryError("no IPv4 address to broadcast from; give --center HOST:PORT or --discovery-address ADDR")
    sent: Counter[Target] = Counter()
    send_errors: dict[Target, OSError] = {}
    answered = trio.Event()

    async def listen(sock) -> None:
        while True:
            try:
                data, (source, *_) = await sock.recvfrom(MAX_DATAGRAM + 1)
            except OSError as exc:  # an ICMP error of an earlier send: not an answer
                log.debug("discovery: receive failed: %s", exc)
                await trio.sleep(RECEIVE_ERROR_PAUSE)
                continue
            if search.receive(data, source, trio.current_time()) is not None:
                answered.set()

    async def ask(socks: dict) -> None:
        sends = 0
        while True:
            for target in targets:
                try:
                    await socks[target.source].sendto(search.datagram, (target.address, port))
                    sent[target] += 1
                except OSError as exc:
                    if target not in send_errors:
                        log.warning("discovery: cannot send to %s:%d%s: %s (retrying)", target.address, port,
                                    target.via, exc)
                    send_errors[target] = exc
                    search.counters.inc("discovery_failed", reason="send")
            sends += 1
            with trio.move_on_after(resend.delay(sends, rng)):
                await answered.wait()
                return

    with contextlib.ExitStack() as stack:
        socks = await _bind_sockets(stack, targets)
        async with trio.open_nursery() as nursery:
            for sock in socks.values():
                nursery.start_soon(listen, sock)
            with trio.move_on_after(timeout):
                await ask(socks)
                await trio.sleep(settle)
            nursery.cancel_scope.cancel()
    if not search.found:
        raise DiscoveryError(_nobody(search, targets, port, timeout, sent, send_errors))
    return search.result()


async def _bind_sockets(stack: contextlib.ExitStack, targets: Sequence[Target]) -> dict[str | None, Any]:
    """One UDP socket allowed to broadcast per source address of ``targets``, closed with ``stack``."""
    socks = {}
    for source in dict.fromkeys(t.source for t in targets):
        sock = stack.enter_context(trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        try:
            await sock.bind((source or "0.0.0.0", 0))
        except OSError as exc:
            raise DiscoveryError(f"cannot send discovery queries from {source}: {exc}") from None
        socks[source] = sock
    return socks


def _nobody(search: Search, targets: Sequence[Target], port: int, timeout: float, sent: Counter,
            send_errors: dict) -> str:
    where = ", ".join(f"{sent[t]} to {t.address}{t.via}" + (f" (last error: {send_errors[t]})" if t in send_errors
                                                             else "") for t in targets)
    text = f"no center answered on UDP port {port} within {timeout:g} s (queries: {where})"
    if search.query.network is not None:
        text += f" for network {search.query.network}"
    if search.rejected:
        text += "; answers rejected: " + ", ".join(f"{n} {r}" for r, n in sorted(search.rejected.items()))
        if "bad-tag" in search.rejected:
            text += " (bad-tag: the answering center's LAN key is not ours)"
    hint = " with the same --lan-key-file" if search.keyring else ""
    return (text + f". Is the center running, with discovery on (no --no-discovery), on this LAN, with "
            f"--discovery-port {port}{hint}? Or give --center HOST:PORT.")
