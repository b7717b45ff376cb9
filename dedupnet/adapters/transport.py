"""trio transport: dedupnet messages framed on TCP streams, a listener and a reconnecting client.

This is the I/O adapter around the sans-I/O codec in :mod:`dedupnet.codec.wire`: it reads bytes
from a :class:`trio.SocketStream`, feeds them to a :class:`~dedupnet.codec.wire.Decoder` and
hands out messages; it takes bytes already encoded with :func:`~dedupnet.codec.wire.encode` and
writes them out. It knows nothing of the protocol's decisions beyond the handshake.

Why it is shaped this way
-------------------------

* **A stalled peer never blocks anyone else.** Every connection has a bounded outgoing
  queue (a trio memory channel, ``max_queue`` messages) drained by its own writer task.
  :meth:`Connection.send_nowait` never waits: a center broadcasting one encoded frame to
  every host calls it per peer, and a peer whose queue is full is closed (and counted)
  instead of holding up the broadcast. :meth:`Connection.send` waits for room, but at most
  ``send_timeout`` seconds; the writer's own ``send_all`` has the same deadline.
* **Bad input costs one connection, never the daemon.** A :class:`~dedupnet.codec.errors.ProtocolError`
  from the decoder is logged once, counted under its reason, answered with an
  :class:`~dedupnet.codec.messages.Error` (best effort, short deadline) and the connection is
  closed; the stream cannot be resynchronised anyway (see :mod:`dedupnet.codec.wire`).
  A message that decodes but then raises where the daemon handles it (its reactor) is
  handed back with :meth:`Connection.fail` and raised from that connection's receive:
  the handler's catch-all (``handler_error`` / ``session_error``, logged with the
  traceback) is the one place an exception caused by a peer lands, and it closes that
  connection only.
* **The sender is the connection, not the frame.** A connection starts with a
  :class:`~dedupnet.codec.messages.Register`; with ``verify_source`` (the default) the server
  accepts it only if its ``IP`` is the TCP peer address, so everything arriving later on
  that connection is attributed to an address the kernel vouches for (paper gap 2 in
  ``source-protocol.md``). Clients therefore bind their source address to their own IP
  (``local_ip``); on Linux any 127.x.y.z can be bound, which is how one machine hosts a
  whole simulated system.
* **Heartbeats never queue behind data.** :meth:`Connection.send_urgent` puts a message
  in a one-slot priority lane that the writer takes before the next queued message
  (after finishing the one it is writing: messages are never interleaved); a newer
  urgent message replaces an unsent one. The daemons send their heartbeats this way, so
  a busy connection does not make its peer think it is dead.
* **Compression is negotiated, never assumed.** :func:`connect` offers ``zstd`` in its
  Register (``compress=True``, the default); :func:`serve` answers such a Register with a
  :class:`~dedupnet.codec.messages.Welcome` naming what it accepts, which the client's
  :meth:`Connection.receive` consumes. From then on both directions send bodies of at
  least ``wire.COMPRESS_MIN_BODY`` bytes compressed. A peer that offers nothing (an
  older one, or ``compress=False``) gets no Welcome and only plain bodies. Callers
  always hand the connection one encoded form (plain, or ``encode(..., compress=True)``)
  and the connection converts it for its peer, once per encoded object, so a broadcast
  is compressed once however many peers it goes to.
* **Frames can be authenticated** (:mod:`dedupnet.codec.auth`). A connection
  with a :class:`~dedupnet.codec.auth.Keyring` tags every message it sends with the keyring's
  sending key (after compression: the tag covers the body as sent; once per encoded
  object and key, so a broadcast is still signed once) and its decoder rejects any
  message without a valid tag of an accepted key *before* the body is decompressed
  or parsed (``bad_input{reason="bad-tag"}``, connection closed). A server is given a
  keyring per role (``keyrings``: a center's hosts and control clients use the LAN
  key, its peer centers the peer key): the Register must verify under one of them and
  its role must be one whose keyring verified it; from then on the connection uses
  that keyring only. A role without a keyring is served as before (untagged).
* **Limits against abuse**. ``max_connections_per_source`` caps the
  connections one source address may hold open (one more is closed at once, counted
  ``handshake_failed{reason="too-many"}``); the handshake deadline bounds a client
  that trickles its Register (slowloris) however slowly it sends; and each connection
  may have token buckets on the bytes and the messages it receives
  (``max_bytes_per_s``, ``max_messages_per_s``, each with a burst). A connection over
  its rate is *throttled*, not closed: its reader stops reading until the bucket has
  refilled (counted ``throttled{what}``), so TCP flow control slows the sender down and
  a flood costs the daemon at most the configured rate. Throttling rather than closing
  because a legitimate burst (a host catching up after a reconnect) must only be
  delayed, never dropped; a peer that sends garbage is closed by the decoder anyway.
* **A flood of connections cannot flood the log.** Every line a server writes about a
  connection (refused, aborted, bad input, registered) goes through one
  :class:`~dedupnet.adapters.ratelimit.LogLimiter` per listener: a budget per source
  address and one for all together; what is over it is counted (``log_suppressed``)
  and the next line about that source says how many were left out.
* **Every wait has a deadline**: connect, handshake, each send, the writer's
  ``send_all``, the best-effort error and the flush on close. The one exception is
  :meth:`Connection.receive`, which waits as long as its caller wants (pass ``timeout=``
  or wrap it; the daemons' heartbeat deadline is that bound).

Running a connection
--------------------

A :class:`Connection` is an async context manager: entering it starts its writer task in
an internal nursery; leaving it closes the connection (flushing the queue for up to
``close_timeout`` seconds if the block ended normally, at once if it raised). Exceptions
from the block propagate unchanged (not wrapped in an ExceptionGroup)::

    async with await connect("127.0.0.1", 7000, register, local_ip="127.0.0.5",
                             counters=counters) as conn:
        conn.send_nowait(encode(frame))
        msg = await conn.receive()

:func:`serve` enters the connection for its handler, and :func:`connect_forever` for its
``on_connected`` session; their callbacks get a running connection. Only one task may
call :meth:`Connection.receive` at a time; any number may send.

Counters (in the :class:`~dedupnet.adapters.metrics.Counters` passed in)
---------------------------------------------------------------

=======================================  =======================================================
``frames_received{kind[,flag]}``         messages decoded; ``flag`` only for kind ``frame``
``received_bytes``                       bytes read from sockets
``frames_sent{kind}``, ``sent_bytes``    messages / bytes written (counted once written;
                                         bytes as sent, i.e. compressed where negotiated)
``compressed_sent``                      messages sent with a compressed body
``compressed_received``                  messages received with a compressed body
``urgent_replaced``                      an unsent urgent message replaced by a newer one
``bad_input{reason}``                    ProtocolError reasons (bad-magic, too-large,
                                         bad-compression, unexpected-welcome, ...)
``send_overflow``                        send_nowait found the queue full (peer closed)
``send_timeout``                         send / the writer waited past ``send_timeout``
``connections_accepted``                 server: TCP connections accepted
``handshake_failed{reason}``             server: timeout, not-register, bad-role,
                                         source-mismatch, closed, bad-input,
                                         too-many (max_connections_per_source)
``throttled{what}``                      a receive waited for a rate limit (``bytes``,
                                         ``messages``)
``key_reloads``, ``key_reload_failed``   :func:`watch_keyrings`: key files re-read
``handler_error``                        server: a handler raised (logged with traceback)
``connected``, ``connect_failed``        client: connections made / attempts failed
``handshake_failed{reason="tls"}``       TLS (dedupnet/adapters/tls.py): the TLS handshake failed (wrong
                                         CA, no client certificate, not TLS), or a plain
                                         connection for a role that must use TLS; both sides
``handshake_failed{reason="wrong-network"}``  the peer's certificate names another network
``tls_sent_bytes``, ``tls_received_bytes``  TCP bytes of TLS connections (records, handshakes)
``tls_payload_sent_bytes``               the part of ``sent_bytes`` that went inside TLS
``session_error``                        client: ``on_connected`` raised (logged)
``heartbeat_missed``                     client: the server was silent for ``silence_timeout``
                                         (connection given up, dialled again)
``log_suppressed``                       server: a line about a connection not logged, its
                                         source over its budget (dedupnet/adapters/ratelimit.py)
=======================================  =======================================================
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
import random
import ssl
import struct
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import trio

from dedupnet.codec.auth import Keyring
from dedupnet.codec.errors import ProtocolError
from dedupnet.codec.messages import COMPRESSIONS, MAX_URLS, Error, Frame, Kind, Message, Register, Welcome, normalize_ip
from dedupnet.adapters.listen import open_listeners
from dedupnet.adapters.metrics import Counters
from dedupnet.adapters.ratelimit import LogLimiter, TokenBucket
from dedupnet.adapters.tls import ServerTLS, TLSRefused, expected_uri_problem, sniff_tls, ssl_error_text, wrap
from dedupnet.codec.wire import (
    COMPRESS_MIN_BODY,
    DEFAULT_MAX_FRAME_SIZE,
    HEADER_SIZE,
    MAGIC,
    NEED_DATA,
    Decoder,
    compressed,
    encode,
    is_compressed,
    uncompressed,
)

__all__ = [
    "ConnectionClosed",
    "Connection",
    "Handler",
    "serve",
    "connect",
    "connect_forever",
    "close_when_silent",
    "TokenBucket",
    "watch_keyrings",
]

log = logging.getLogger("dedupnet.adapters.transport")

RECEIVE_CHUNK = 64 * 1024  # bytes per receive_some
DEFAULT_MAX_QUEUE = 1024  # messages waiting for the writer, per connection
DEFAULT_SEND_TIMEOUT = 10.0
DEFAULT_CLOSE_TIMEOUT = 1.0  # flush on a normal close
DEFAULT_ERROR_TIMEOUT = 1.0  # best-effort Error message before closing
LINGER_BYTES = 256 * 1024  # input read and discarded after an Error (see _linger)
MAX_ERROR_MESSAGE = 1000  # characters of the Error message we send (schema allows 4096)

_KIND_NAMES = {kind.value: kind.name.lower() for kind in Kind}
_BODY_AND_TAG = struct.Struct(">IB")  # body_len, tag_len at offset 4 of the header

Handler = Callable[["Connection"], Awaitable[None]]


class ConnectionClosed(Exception):
    """The connection is closed (by the peer, by bad input, a timeout, an overflow or us).

    Handlers may let it escape: :func:`serve` and :func:`connect_forever` treat it as the
    normal end of a connection.
    """


def _peer_ip(address: Any) -> str:
    """The peer's IP in canonical text; IPv4-mapped IPv6 (dual-stack sockets) as IPv4."""
    host = address[0] if isinstance(address, tuple) else str(address)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host  # e.g. a scoped IPv6 address; compared as given
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return normalize_ip(host)


def _without_closed(exc: BaseException) -> BaseException | None:
    """``exc`` minus its ConnectionClosed parts, None if nothing else is left. A handler
    with its own nursery reports ConnectionClosed inside an exception group."""
    if isinstance(exc, ConnectionClosed):
        return None
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(ConnectionClosed)[1]
    return exc


_RECODED: OrderedDict[tuple[int, bool], tuple[bytes, bytes]] = OrderedDict()
_RECODED_MAX = 4  # a broadcast sends one object to every peer in a row: a few entries suffice


def _recode(data: bytes, compress: bool) -> bytes:
    """``data`` with its bodies compressed (``compress``) or plain, converted once per
    object: a broadcast calls this with the same bytes for every peer, and every peer
    gets the same converted object (one compression, one copy in memory)."""
    if compress:
        if len(data) < HEADER_SIZE + COMPRESS_MIN_BODY:
            return data
    elif not is_compressed(data):
        return data
    key = (id(data), compress)
    hit = _RECODED.get(key)
    if hit is not None and hit[0] is data:
        _RECODED.move_to_end(key)
        return hit[1]
    out = compressed(data) if compress else uncompressed(data)
    if out is not data:
        _RECODED[key] = (data, out)  # holding data keeps its id from being reused
        if len(_RECODED) > _RECODED_MAX:
            _RECODED.popitem(last=False)
    return out


_SIGNED: OrderedDict[tuple[int, int, int], tuple[bytes, Keyring, bytes]] = OrderedDict()


def _signed(data: bytes, keyring: Keyring) -> bytes:
    """``data`` tagged with ``keyring``'s sending key, once per object and key (a
    broadcast signs once for all the peers of one keyring, as it compresses once)."""
    key = (id(data), id(keyring), keyring.send_id)
    hit = _SIGNED.get(key)
    if hit is not None and hit[0] is data and hit[1] is keyring:
        _SIGNED.move_to_end(key)
        return hit[2]
    out = keyring.sign(data)
    _SIGNED[key] = (data, keyring, out)
    if len(_SIGNED) > _RECODED_MAX:
        _SIGNED.popitem(last=False)
    return out


def _sent_kinds(data: bytes) -> list[str]:
    """The kinds of the messages in ``data`` (normally one), from their headers: byte 3 of
    each header is the kind, bytes 4..8 the body length, byte 8 the tag length."""
    kinds = []
    offset = 0
    while offset + HEADER_SIZE <= len(data) and data[offset : offset + 2] == MAGIC:
        kinds.append(_KIND_NAMES.get(data[offset + 3], "unknown"))
        body_len, tag_len = _BODY_AND_TAG.unpack_from(data, offset + 4)
        offset += HEADER_SIZE + body_len + tag_len
    return kinds or ["unknown"]


def _socket_of(stream: trio.abc.Stream) -> Any:
    """The socket under a stream: a SocketStream's own, or the one under an SSLStream
    (its ``transport_stream``, possibly a counting wrapper with a ``socket``)."""
    while not hasattr(stream, "socket"):
        stream = stream.transport_stream  # AttributeError: a stream with no socket under it
    return stream.socket


class Connection:
    """One framed TCP connection: decoding receiver, bounded queue, writer task.

    Attributes:
        stream: the :class:`trio.SocketStream`, or a :class:`trio.SSLStream` over one
            (dedupnet/adapters/tls.py); the peer address is always the socket's.
        tls: whether the connection is TLS; ``peer_cert``: the peer's verified
            certificate (:meth:`ssl.SSLSocket.getpeercert`), ``{}`` without one.
        peer_ip: the remote address, canonical text (the identity ``verify_source`` checks).
        peer: ``ip:port`` of the remote end, for log lines.
        register: the peer's :class:`Register` once the handshake accepted it (server
            side), or the one we sent (client side, set by :func:`connect`).
        counters: where this connection counts what it does.
        close_reason: why it closed (``eof``, ``bad-input:<reason>``, ``error:<reason>``
            (we rejected the peer), ``send-overflow``, ``send-timeout``, ``broken``,
            ``failed`` (:meth:`fail`), ``local``, ``silent``: given up by :func:`close_when_silent`), None
            while open.
        compress: whether this side offers/accepts compressed bodies (the setting).
        compression: the compression negotiated with the peer (``"zstd"``), or None:
            then only plain bodies are sent to it, and a compressed one from it is
            bad input.
        keyring: the :class:`~dedupnet.codec.auth.Keyring` that tags what is sent and must
            verify what is received, or None (no authentication on this connection).

    Use it as an async context manager (see the module docstring); the writer runs only
    inside the ``async with`` block. Messages queued before entering are sent once the
    writer starts.
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        counters: Counters,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_urls: int = MAX_URLS,
        max_queue: int = DEFAULT_MAX_QUEUE,
        send_timeout: float = DEFAULT_SEND_TIMEOUT,
        close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
        error_timeout: float = DEFAULT_ERROR_TIMEOUT,
        compress: bool = True,
        keyring: Keyring | None = None,
        max_bytes_per_s: float | None = None,
        burst_bytes: float | None = None,
        max_messages_per_s: float | None = None,
        burst_messages: float | None = None,
        log_limit: LogLimiter | None = None,
    ) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.stream = stream
        self.counters = counters
        self._socket = _socket_of(stream)
        self.tls = isinstance(stream, trio.SSLStream)
        self.peer_cert: dict | None = stream.getpeercert() if self.tls else None
        address = self._socket.getpeername()  # OSError if the peer is already gone
        self.peer_ip = _peer_ip(address)
        port = address[1] if isinstance(address, tuple) and len(address) > 1 else 0
        self.peer = f"[{self.peer_ip}]:{port}" if ":" in self.peer_ip else f"{self.peer_ip}:{port}"
        self.register: Register | None = None
        self.close_reason: str | None = None
        self.send_timeout = send_timeout
        self.close_timeout = close_timeout
        self.error_timeout = error_timeout
        self.compress = compress
        self.compression: str | None = None
        self._offered = False  # client: our Register offered compression
        self._welcomed = False  # client: the server's Welcome arrived
        #: Tags what we send and is required on what we receive (None: no authentication).
        self.keyring = keyring
        self._decoder = Decoder(max_frame_size, max_urls, allow_compressed=False, keyring=keyring)
        now = trio.current_time()
        # A burst must hold at least one whole frame of the largest size, or it could never be read.
        self._byte_bucket = None if not max_bytes_per_s else TokenBucket(
            max_bytes_per_s, max(burst_bytes or max_bytes_per_s, HEADER_SIZE + max_frame_size + 255), now)
        self._message_bucket = None if not max_messages_per_s else TokenBucket(
            max_messages_per_s, max(burst_messages or max_messages_per_s, 1), now)
        self._compressed_seen = 0
        self._send_ch, self._recv_ch = trio.open_memory_channel[bytes](max_queue)
        self._urgent: bytes | None = None  # the priority lane: one slot, newest wins
        self._held: bytes | None = None  # taken from the queue, sent after the urgent one
        #: trio time the last message went out whole (or the connection was made): a
        #: link that carries messages needs no heartbeat, any message is one.
        self.last_sent = trio.current_time()
        self._idle_scope: trio.CancelScope | None = None  # the writer waiting for data
        self._closing = False  # no more sends accepted (flushing or closed)
        self._closed = False  # socket closed
        self._writer_running = False
        self._writer_done = trio.Event()
        self._exit_stack: contextlib.AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None
        #: When the peer was last heard from (any bytes), or when we last started
        #: listening for it: only time spent waiting in :meth:`receive` is its silence.
        self._heard = now
        self._listening = False
        self._failure: Exception | None = None  # see fail()
        #: A server's budget of log lines per source (None: a client, which logs freely).
        self.log_limit = log_limit

    def note(self, level: int, msg: str, *args: object, logger: logging.Logger = log,
             exc_info: object = None) -> None:
        """A log line about this connection: anything its peer can provoke goes through
        here, under the server's per-source budget (:class:`~dedupnet.adapters.ratelimit.LogLimiter`)."""
        if self.log_limit is None:
            logger.log(level, msg, *args, exc_info=exc_info)
        else:
            self.log_limit.log(logger, level, self.peer_ip, msg, *args, exc_info=exc_info)

    def __repr__(self) -> str:
        state = f"closed ({self.close_reason})" if self._closing else "open"
        return f"<Connection {self.peer} {state}>"

    @property
    def closed(self) -> bool:
        """True once the connection stopped accepting messages (closing or closed)."""
        return self._closing

    # -- lifecycle --

    async def __aenter__(self) -> Connection:
        if self._exit_stack is not None:
            raise RuntimeError("a Connection can be entered only once")
        stack = contextlib.AsyncExitStack()
        self._nursery = await stack.enter_async_context(trio.open_nursery())
        self._exit_stack = stack
        try:
            await self._nursery.start(self._writer)
        except BaseException:
            self._close_now("local")
            self._nursery.cancel_scope.cancel()
            await stack.aclose()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        # The block's exception is not passed into the nursery: with strict exception
        # groups it would come out wrapped. The writer never raises (it closes the
        # connection instead), so the nursery only has to be cancelled and waited for;
        # trio's nursery exit waits for its children even when the caller is cancelled.
        try:
            if exc_type is None:
                await self.aclose()
            else:
                self._close_now("local")
        finally:
            assert self._nursery is not None and self._exit_stack is not None
            self._nursery.cancel_scope.cancel()
            await self._exit_stack.aclose()
        return False

    def _close_now(self, reason: str) -> None:
        """Close at once (synchronously): drop the queue, close the socket. Tasks blocked
        in receive or in the writer's send_all get ClosedResourceError."""
        if self.close_reason is None:
            self.close_reason = reason
        self._closing = True
        if self._closed:
            return
        self._closed = True
        self._urgent = self._held = None
        self._send_ch.close()
        self._recv_ch.close()  # frees the queued bytes now
        self._socket.close()

    def fail(self, exc: Exception) -> None:
        """Handling what the peer sent raised ``exc`` somewhere else (the daemon's
        reactor): close the connection at once, and raise ``exc`` from the receive of
        this connection's handler. The handler's catch-all (:func:`serve`'s, or
        :func:`connect_forever`'s) is so the one place where a failure caused by a
        peer lands, and it ends that connection only."""
        if self._failure is None:
            self._failure = exc
        self._close_now("failed")

    def _ended(self, text: str) -> Exception:
        """What receive raises once the connection is closed: the failure, if any."""
        return self._failure if self._failure is not None else ConnectionClosed(text)

    async def aclose(self, *, flush_timeout: float | None = None) -> None:
        """Close the connection, first letting the writer send what is queued for up to
        ``flush_timeout`` seconds (default ``close_timeout``; 0 closes at once)."""
        timeout = self.close_timeout if flush_timeout is None else flush_timeout
        try:
            if not self._closing and self._writer_running and timeout > 0:
                self._closing = True
                self._send_ch.close()  # the writer drains the queue, then ends
                with trio.move_on_after(timeout):
                    await self._writer_done.wait()
        finally:  # also when cancelled while flushing
            self._close_now("local")
        await trio.lowlevel.checkpoint()

    async def close_with_error(self, reason: str, message: str) -> None:
        """Tell the peer why (an :class:`Error` message, best effort) and close.

        Waits at most ``error_timeout`` seconds: the Error goes out after what is already
        queued, then the write side is shut down and input is read and discarded until the
        peer closes (at most LINGER_BYTES), so that closing does not reset the connection
        before the peer has read the Error.
        """
        if self._closing:
            self._close_now("local")
            await trio.lowlevel.checkpoint()
            return
        data = self._prepare(encode(Error(reason, message[:MAX_ERROR_MESSAGE])))
        try:
            with trio.move_on_after(self.error_timeout):
                if self._writer_running:
                    self._send_ch.send_nowait(data)  # WouldBlock: queue full, skip the Error
                    self._closing = True
                    self._send_ch.close()
                    await self._writer_done.wait()
                else:
                    self._closing = True
                    await self.stream.send_all(data)
                    self._count_sent(data)
                if not self._closed:
                    if hasattr(self.stream, "send_eof"):  # TLS has no half-close: read until the peer closes
                        await self.stream.send_eof()
                    await self._linger()
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError,
                trio.BusyResourceError, OSError):
            pass  # best effort: the peer may be gone or stalled
        finally:  # also when cancelled meanwhile
            self._close_now(f"error:{reason}")
        await trio.lowlevel.checkpoint()

    async def _linger(self) -> None:
        received = 0
        while received < LINGER_BYTES:
            data = await self.stream.receive_some(RECEIVE_CHUNK)
            if not data:
                return
            received += len(data)

    # -- receiving --

    async def receive(self, *, timeout: float | None = None) -> Message:
        """The next message from the peer.

        Raises :class:`ConnectionClosed` at EOF, when the connection is closed, and after
        bad input (which is logged, counted, answered with an Error, and closes the
        connection). With ``timeout``, raises :class:`trio.TooSlowError` if no complete
        message arrived in time; the connection stays usable (nothing is lost).
        """
        self._heard, self._listening = trio.current_time(), True
        try:
            if timeout is None:
                return await self._receive()
            with trio.fail_after(timeout):
                return await self._receive()
        finally:
            self._listening = False

    @property
    def silent_since(self) -> float:
        """Since when (trio time) the peer has sent nothing while we were listening for
        it; now while nobody is in :meth:`receive`. A reader that is busy (its consumer is
        full) is not listening, so the peer is not silent meanwhile: slow is not dead."""
        return self._heard if self._listening else trio.current_time()

    def excuse(self, seconds: float) -> None:
        """Do not count ``seconds`` against the peer: this process was paused (a GC, a
        VM freeze, an overloaded event loop), so its silence is ours."""
        self._heard += seconds

    async def _receive(self) -> Message:
        decoder = self._decoder
        while True:
            if self._byte_bucket is not None or self._message_bucket is not None:
                await self._throttle()
            try:
                msg = decoder.next_message()
                if msg is not NEED_DATA:
                    if self._message_bucket is not None:
                        self._message_bucket.take(1, trio.current_time())
                    self._count_received(msg)
                    if type(msg) is Welcome:  # the transport's own: never handed out
                        self._on_welcome(msg)
                        continue
                    return msg
                if self._closed:
                    raise self._ended(f"connection to {self.peer} is closed ({self.close_reason})")
                try:
                    data = await self.stream.receive_some(RECEIVE_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    self._close_now("broken")
                    raise self._ended(f"connection to {self.peer} lost: {exc}") from None
                if not data:
                    decoder.eof()  # ProtocolError("truncated") inside a frame
                    self._close_now("eof")
                    raise ConnectionClosed(f"{self.peer} closed the connection")
                self._heard = trio.current_time()
                self.counters.inc("received_bytes", len(data))
                if self._byte_bucket is not None:
                    self._byte_bucket.take(len(data), trio.current_time())
                decoder.feed(data)
            except ProtocolError as exc:
                await self._bad_input(exc)
                raise ConnectionClosed(f"bad input from {self.peer}: {exc.reason}") from exc

    async def _throttle(self) -> None:
        """Wait while a rate limit is in debt (before decoding or reading more: a cancel
        here loses nothing, the bytes stay in the decoder or the socket)."""
        for what, bucket in (("bytes", self._byte_bucket), ("messages", self._message_bucket)):
            if bucket is None:
                continue
            wait = bucket.wait(trio.current_time())
            if wait > 0:
                self.counters.inc("throttled", what=what)
                log.debug("%s is over its %s rate: not reading for %.3f s", self.peer, what, wait)
                await trio.sleep(wait)
                self._heard = trio.current_time()  # our own limit, not the peer's silence

    def _use_keyring(self, keyring: Keyring | None) -> None:
        """Server side, after the handshake: this connection's keyring from now on."""
        self.keyring = keyring
        self._decoder.verify_tag = keyring.verify if keyring is not None else None
        self._decoder.tag_len_required = keyring.tag_len if keyring is not None else None

    def _negotiated(self, compression: str) -> None:
        self.compression = compression
        self._decoder.allow_compressed = True
        log.debug("%s: %s bodies negotiated", self.peer, compression)

    def _on_welcome(self, msg: Welcome) -> None:
        """Client side: the server's answer to our offer (a ProtocolError if we did not
        offer, already had one, or it names a compression we did not offer)."""
        if not self._offered or self._welcomed:
            raise ProtocolError("welcome from a peer that was not asked for one", "unexpected-welcome")
        self._welcomed = True
        offered = self.register.compress or () if self.register is not None else ()
        for name in msg.compress:
            if name not in offered or name not in COMPRESSIONS:
                raise ProtocolError(f"welcome chose compression {name!r}, which was not offered",
                                    "unexpected-welcome")
        if "zstd" in msg.compress:
            self._negotiated("zstd")

    def _count_received(self, msg: Message) -> None:
        if self._decoder.compressed_messages != self._compressed_seen:
            self._compressed_seen = self._decoder.compressed_messages
            self.counters.inc("compressed_received")
        if type(msg) is Frame:
            self.counters.inc("frames_received", kind="frame", flag=str(msg.flag))
            return
        self.counters.inc("frames_received", kind=_KIND_NAMES[msg.KIND])
        if type(msg) is Error:
            self.note(logging.WARNING, "%s sent error: %s: %s", self.peer, msg.reason, msg.message)

    async def _bad_input(self, exc: ProtocolError) -> None:
        self.note(logging.WARNING, "bad input from %s: %s: %s", self.peer, exc.reason, exc)
        self.counters.inc("bad_input", reason=exc.reason)
        if self.close_reason is None:
            self.close_reason = f"bad-input:{exc.reason}"
        await self.close_with_error(exc.reason, str(exc))

    # -- sending --

    def _prepare(self, data: bytes) -> bytes:
        """The form of ``data`` this peer gets: compressed if negotiated (and the body is
        large enough), plain otherwise. Converted once per object, so a broadcast of one
        encoded frame is compressed (or decompressed for old peers) once; then tagged
        with this connection's keyring, if any (once per converted object and key)."""
        data = _recode(data, self.compression is not None)
        if self.keyring is not None:
            data = _signed(data, self.keyring)
        return data

    def send_nowait(self, data: bytes) -> bool:
        """Queue encoded bytes (one message) for the writer; never blocks.

        Returns False if the connection is closed, or if the queue is full — then the
        peer is too slow to keep up: the connection is closed, logged and counted
        (``send_overflow``) so that it cannot hold up anyone else.

        ``data`` may be plain or compressed (``encode(..., compress=True)``): the peer
        gets bodies compressed if it negotiated compression, plain if it did not.
        """
        if self._closing:
            return False
        data = self._prepare(data)
        try:
            self._send_ch.send_nowait(data)
        except trio.WouldBlock:
            self.note(logging.WARNING, "send queue to %s is full (%d messages): closing the connection",
                      self.peer, self._send_ch.statistics().max_buffer_size)
            self.counters.inc("send_overflow")
            self._close_now("send-overflow")
            return False
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        return True

    async def send(self, data: bytes) -> None:
        """Queue encoded bytes, waiting up to ``send_timeout`` seconds for room.

        Raises :class:`ConnectionClosed` if the connection is (or gets) closed or the wait
        times out (which closes it and counts ``send_timeout``).
        """
        if self._closing:
            raise ConnectionClosed(f"connection to {self.peer} is closed ({self.close_reason})")
        data = self._prepare(data)
        with trio.move_on_after(self.send_timeout):
            try:
                await self._send_ch.send(data)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                raise ConnectionClosed(f"connection to {self.peer} is closed ({self.close_reason})") from None
            return
        if self._closing:  # the writer gave up at the same moment and closed it
            raise ConnectionClosed(f"connection to {self.peer} is closed ({self.close_reason})")
        self.note(logging.WARNING, "send queue to %s stayed full for %.1f s: closing the connection", self.peer,
                  self.send_timeout)
        self.counters.inc("send_timeout")
        self._close_now("send-timeout")
        raise ConnectionClosed(f"send to {self.peer} timed out")

    def send_urgent(self, data: bytes) -> bool:
        """Send encoded bytes (one message, e.g. a heartbeat) ahead of everything queued.

        The priority lane has one slot: the writer takes it before the next queued
        message, after finishing the message it is writing (messages are never
        interleaved). A newer urgent message replaces one not yet sent (only the newest
        heartbeat matters; counted ``urgent_replaced``). Never blocks; returns False if
        the connection is closed.
        """
        if self._closing:
            return False
        if self._urgent is not None:
            self.counters.inc("urgent_replaced")
        self._urgent = self._prepare(data)
        if self._idle_scope is not None:
            self._idle_scope.cancel()  # wake the writer waiting on the queue
        return True

    def _count_sent(self, data: bytes) -> None:
        for kind in _sent_kinds(data):
            self.counters.inc("frames_sent", kind=kind)
        self.counters.inc("sent_bytes", len(data))
        if self.tls:
            self.counters.inc("tls_payload_sent_bytes", len(data))
        if is_compressed(data):
            self.counters.inc("compressed_sent")

    async def _next_to_send(self) -> bytes | None:
        """The urgent message if any, else the next queued one (waiting for either);
        None once the queue is closed and drained. Raises ClosedResourceError if closed."""
        while True:
            data, self._urgent = self._urgent, None
            if data is not None:
                return data
            data, self._held = self._held, None
            if data is not None:
                return data
            try:
                return self._recv_ch.receive_nowait()
            except trio.WouldBlock:
                pass
            except trio.EndOfChannel:
                return None
            # Wait for queued data; send_urgent cancels the wait. A receive that already
            # got an item returns it even if cancelled meanwhile (trio channels are
            # cancel-safe), so nothing is lost.
            with trio.CancelScope() as self._idle_scope:
                try:
                    data = await self._recv_ch.receive()
                except trio.EndOfChannel:
                    return None
                finally:
                    self._idle_scope = None
                if self._urgent is None:
                    return data
                self._held = data  # an urgent message came while this one was handed over


    async def _writer(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Send the urgent slot first, then queued bytes in order, until the queue is
        closed. Never raises: any failure closes the connection, which the receiving side
        then sees as ConnectionClosed."""
        self._writer_running = True
        task_status.started()
        try:
            while (data := await self._next_to_send()) is not None:
                with trio.move_on_after(self.send_timeout) as scope:
                    await self.stream.send_all(data)
                if scope.cancelled_caught:
                    if self._closed:
                        return  # closed meanwhile (e.g. send() timed out at the same moment)
                    self.note(logging.WARNING, "%s took no data for %.1f s: closing the connection", self.peer,
                              self.send_timeout)
                    self.counters.inc("send_timeout")
                    self._close_now("send-timeout")
                    return
                self.last_sent = trio.current_time()
                self._count_sent(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError) as exc:
            if not self._closed:
                self.note(logging.INFO, "connection to %s lost while sending: %s", self.peer, exc)
            self._close_now("broken")
        except Exception:
            log.exception("writer for %s failed", self.peer)
            self.counters.inc("writer_error")
            self._close_now("broken")
        finally:
            self._writer_running = False
            self._writer_done.set()


# --- server -------------------------------------------------------------------------------


class _HandshakeTags:
    """The decoder's tag check until the Register has said which role (and so which
    keyring) a connection has: a tag must verify under one of the keyrings of the
    accepted roles; an untagged Register passes only if some accepted role has no
    keyring. :attr:`verified` holds the keyrings that verified it."""

    def __init__(self, keyrings: dict[str, Keyring], accept_roles: tuple[str, ...]) -> None:
        self.rings = list({id(k): k for role, k in keyrings.items() if role in accept_roles}.values())
        self.open_roles = any(role not in keyrings for role in accept_roles)
        self.verified: list[Keyring] = []
        self.tagged = False

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


async def _handshake(
    conn: Connection, handshake_timeout: float, verify_source: bool, accept_roles: tuple[str, ...],
    keyrings: dict[str, Keyring] | None = None, tags: _HandshakeTags | None = None,
    tls: ServerTLS | None = None,
) -> Register | None:
    """The peer's Register if acceptable; otherwise log, count, tell the peer, close."""
    counters = conn.counters
    msg: Message | None = None
    with trio.move_on_after(handshake_timeout):
        try:
            msg = await conn.receive()
        except ConnectionClosed:
            if conn.close_reason and conn.close_reason.startswith("bad-input"):
                counters.inc("handshake_failed", reason="bad-input")  # logged by receive()
            else:
                conn.note(logging.INFO, "%s closed the connection before registering", conn.peer)
                counters.inc("handshake_failed", reason="closed")
            return None
    if msg is None:
        reason, text = "timeout", f"no register message within {handshake_timeout:g} s"
    elif type(msg) is not Register:
        reason, text = "not-register", f"the first message must be a register, got {_KIND_NAMES[msg.KIND]}"
    elif msg.role not in accept_roles:
        reason, text = "bad-role", f"role {msg.role!r} is not accepted here (accepting {', '.join(accept_roles)})"
    elif verify_source and msg.IP != conn.peer_ip:
        reason, text = "source-mismatch", f"register IP {msg.IP} is not the connection's source address {conn.peer_ip}"
    elif keyrings and tags is not None and msg.role in keyrings and keyrings[msg.role] not in tags.verified:
        # Tagged with another role's key (or untagged, where another role needs no key).
        reason = "bad-input"
        text = f"register of role {msg.role!r} is not tagged with that role's key"
        conn.note(logging.WARNING, "bad input from %s: bad-tag: %s", conn.peer, text)
        counters.inc("bad_input", reason="bad-tag")
        counters.inc("handshake_failed", reason=reason)
        await conn.close_with_error("bad-tag", text)
        return None
    elif tls is not None and (refused := tls.check(conn.tls, conn.peer_cert, msg.role, msg.network, msg.IP)):
        reason, text = refused
    else:
        return msg
    conn.note(logging.WARNING, "handshake with %s failed: %s: %s", conn.peer, reason, text)
    counters.inc("handshake_failed", reason=reason)
    if tags is not None and tags.verified:  # a keyed client reads our Error only if it is tagged
        conn._use_keyring(tags.verified[0])
    await conn.close_with_error(reason, text)
    return None


async def _accept_tls(stream: trio.SocketStream, tls: ServerTLS, counters: Counters,
                      handshake_timeout: float, log_limit: LogLimiter | None = None) -> trio.abc.Stream | None:
    """The stream to read from: an SSLStream after its handshake if the peer starts
    with TLS, the stream itself if it speaks plain dedupnet (whether its role may is
    decided at its Register); None if it failed (logged, counted, closed). Peek and
    handshake together have ``handshake_timeout`` seconds (a slow client holds a
    connection no longer than one that never registers)."""
    try:
        address = stream.socket.getpeername()
        source = _peer_ip(address)
        peer = f"{source}:{address[1]}"
    except (OSError, IndexError, TypeError):
        source, peer = None, "a client that left"
    reason = text = None
    with trio.move_on_after(handshake_timeout):
        try:
            is_tls = await sniff_tls(stream.socket)
        except OSError as exc:
            is_tls, reason, text = None, "closed", str(exc)
        if is_tls is None:
            reason, text = reason or "closed", text or "closed before the first byte"
        elif not is_tls:
            return stream
        else:
            ssl_stream = wrap(stream, tls.context, counters, server_side=True)
            try:
                await ssl_stream.do_handshake()
                counters.inc("tls_handshakes")
                return ssl_stream
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                reason, text = "tls", f"TLS handshake failed: {ssl_error_text(exc)}"
    if reason is None:
        reason, text = "timeout", f"no TLS handshake within {handshake_timeout:g} s"
    _note(log_limit, source, logging.WARNING, "handshake with %s failed: %s: %s", peer, reason, text)
    counters.inc("handshake_failed", reason=reason)
    await trio.aclose_forcefully(stream)
    return None


async def _serve_one(stream: trio.SocketStream, handler: Handler, counters: Counters,
                     handshake_timeout: float, verify_source: bool, accept_roles: tuple[str, ...],
                     conn_options: dict[str, Any], keyrings: dict[str, Keyring] | None = None,
                     tls: ServerTLS | None = None, source: str | None = None) -> None:
    """One accepted connection: handshake, handler, close. Never raises except Cancelled."""
    log_limit = conn_options.get("log_limit")
    try:
        if tls is not None:
            accepted = await _accept_tls(stream, tls, counters, handshake_timeout, log_limit)
            if accepted is None:
                return
            stream = accepted
        try:
            conn = Connection(stream, counters=counters, **conn_options)
        except OSError as exc:  # the peer left before we could look at it
            _note(log_limit, source, logging.INFO, "accepted connection vanished: %s", exc)
            counters.inc("handshake_failed", reason="closed")
            await trio.aclose_forcefully(stream)
            return
        counters.inc("connections_accepted")
        tags = None
        if keyrings:
            tags = _HandshakeTags(keyrings, accept_roles)
            conn._decoder.verify_tag = tags
            conn._decoder.tag_len_required = None if tags.open_roles else tags.rings[0].tag_len
        async with conn:
            register = await _handshake(conn, handshake_timeout, verify_source, accept_roles, keyrings, tags, tls)
            if register is None:
                return
            if keyrings:
                conn._use_keyring(keyrings.get(register.role))
            conn.register = register
            conn.note(logging.INFO, "%s registered: role %s, network %d, listen %s", conn.peer, register.role,
                      register.network, register.listen)
            if register.compress is not None:  # only a client that offered gets a Welcome
                chosen = ("zstd",) if conn.compress and "zstd" in register.compress else ()
                conn.send_nowait(encode(Welcome(chosen)))
                if chosen:
                    conn._negotiated("zstd")
            try:
                await handler(conn)
            except BaseException as exc:
                rest = _without_closed(exc)
                if rest is not None and not isinstance(rest, Exception):
                    raise rest from None  # Cancelled, KeyboardInterrupt: not ours to handle
                if rest is not None:
                    conn.note(logging.ERROR, "handler for %s failed", conn.peer, exc_info=rest)
                    counters.inc("handler_error")
                    conn._close_now("local")
    except Exception:  # a bug in this module: still never take the server down
        log.exception("internal error serving %s", stream)
        counters.inc("handler_error")
        await trio.aclose_forcefully(stream)


async def serve(
    host: str | None,
    port: int,
    handler: Handler,
    *,
    counters: Counters,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    max_urls: int = MAX_URLS,
    handshake_timeout: float = 5.0,
    verify_source: bool = True,
    accept_roles: tuple[str, ...] = ("host", "center"),
    max_queue: int = DEFAULT_MAX_QUEUE,
    send_timeout: float = DEFAULT_SEND_TIMEOUT,
    close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
    compress: bool = True,
    keyrings: dict[str, Keyring] | None = None,
    max_connections_per_source: int | None = None,
    max_bytes_per_s: float | None = None,
    burst_bytes: float | None = None,
    max_messages_per_s: float | None = None,
    burst_messages: float | None = None,
    tls: ServerTLS | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``host:port`` and run ``await handler(conn)`` per registered connection.

    Each accepted connection must first send a :class:`Register` within
    ``handshake_timeout`` seconds, with a role in ``accept_roles`` and (if
    ``verify_source``) an ``IP`` equal to the TCP source address; otherwise it is logged,
    counted (``handshake_failed{reason}``), sent an Error and closed. A Register that
    offers compression is answered with a :class:`Welcome` naming the one accepted
    (``zstd`` if ``compress``, else none) before the handler runs; a client that offers
    nothing gets no Welcome and only plain bodies. The handler gets a
    running :class:`Connection` with ``conn.register`` set; when it returns (or raises
    ConnectionClosed) the connection is closed, queued messages flushed first if it
    returned. Any other exception is logged with its traceback and counted
    (``handler_error``); it ends that connection only.

    With ``tls`` (:class:`dedupnet.adapters.tls.ServerTLS`) a client that starts with a TLS
    handshake gets one (within ``handshake_timeout``; failures are
    ``handshake_failed{reason="tls"}``), a plain client is refused at its Register if
    its role must use TLS, and a certificate that names another network is refused
    (``wrong-network``): ``tls.check``.

    ``port`` 0 picks a free port; the bound port is reported through ``task_status``:
    ``port = await nursery.start(partial(serve, counters=c), "127.0.0.1", 0, handler)``.
    ``host`` None listens on all addresses (IPv4 and IPv6; peers' IPv4-mapped addresses
    are reported as IPv4). Runs until cancelled.

    ``keyrings`` (role -> :class:`~dedupnet.codec.auth.Keyring`): the roles that must tag
    every message (see the module docstring); a Register tagged with no accepted key,
    or not with its own role's key, is ``bad_input{reason="bad-tag"}`` and refused.
    ``max_connections_per_source``: connections one source IP may have open at once (a
    further one is closed at once, counted ``handshake_failed{reason="too-many"}``);
    ``max_bytes_per_s`` / ``max_messages_per_s`` (with their bursts) throttle what each
    connection is read at (:class:`TokenBucket`). None: no limit.
    """
    listeners = await open_listeners(host, port, "--listen")
    bound = listeners[0].socket.getsockname()[1]
    log.info("listening on %s:%d", host or "*", bound)
    log_limit = LogLimiter(counters)
    conn_options = dict(max_frame_size=max_frame_size, max_urls=max_urls, max_queue=max_queue,
                        send_timeout=send_timeout, close_timeout=close_timeout, compress=compress,
                        max_bytes_per_s=max_bytes_per_s, burst_bytes=burst_bytes,
                        max_messages_per_s=max_messages_per_s, burst_messages=burst_messages,
                        log_limit=log_limit)
    accept_roles = tuple(accept_roles)
    keyrings = {role: ring for role, ring in (keyrings or {}).items() if ring is not None} or None
    per_source: dict[str, int] = {}

    async def on_accept(stream: trio.SocketStream) -> None:
        try:
            source = _peer_ip(stream.socket.getpeername())
        except OSError:
            source = None
        counted = max_connections_per_source is not None and source is not None
        if counted and per_source.get(source, 0) >= max_connections_per_source:
            counters.inc("handshake_failed", reason="too-many")
            log_limit.log(log, logging.WARNING, source, "refused a connection from %s: it has %d open already "
                          "(max_connections_per_source)", source, max_connections_per_source)
            await trio.aclose_forcefully(stream)
            return
        if counted:
            per_source[source] = per_source.get(source, 0) + 1
        try:
            await _serve_one(stream, handler, counters, handshake_timeout, verify_source, accept_roles,
                             conn_options, keyrings, tls, source)
        finally:
            if counted:
                left = per_source[source] - 1
                if left:
                    per_source[source] = left
                else:
                    del per_source[source]

    task_status.started(bound)
    await trio.serve_listeners(on_accept, listeners)


def _note(log_limit: LogLimiter | None, source: str | None, level: int, msg: str, *args: object) -> None:
    """A log line about a connection that has no :class:`Connection` yet."""
    if log_limit is None:
        log.log(level, msg, *args)
    else:
        log_limit.log(log, level, source, msg, *args)


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


# --- client -------------------------------------------------------------------------------


async def connect(
    host: str,
    port: int,
    register: Register,
    *,
    local_ip: str | None = None,
    counters: Counters,
    connect_timeout: float = 5.0,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    max_urls: int = MAX_URLS,
    max_queue: int = DEFAULT_MAX_QUEUE,
    send_timeout: float = DEFAULT_SEND_TIMEOUT,
    close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
    compress: bool = True,
    keyring: Keyring | None = None,
    tls_context: ssl.SSLContext | None = None,
    expect_uri: str | None = None,
) -> Connection:
    """Connect to ``host:port`` from ``local_ip`` (if given) and send ``register`` first.

    With ``tls_context`` the connection is TLS (handshake within ``connect_timeout``),
    and with ``expect_uri`` the server's certificate must name it (dedupnet/adapters/tls.py:
    ``dedupnet://network/<N>``); otherwise :class:`dedupnet.adapters.tls.TLSRefused` (an
    OSError) is raised, logged and counted (``handshake_failed{reason="tls"}`` or
    ``"wrong-network"``).

    With ``compress`` the Register offers ``zstd`` (unless ``register`` already carries an
    offer; without ``compress`` any offer is removed); the server's :class:`Welcome`,
    consumed by :meth:`Connection.receive`, turns compression on for both directions.
    Until it arrives (and forever with a server that predates compression) every body
    is sent plain.

    Returns a :class:`Connection` that is not yet running: use it as
    ``async with await connect(...) as conn``. Raises :class:`OSError` on failure
    (:class:`TimeoutError` if the connection or the Register took longer than
    ``connect_timeout``). A server that rejects the Register answers with an
    :class:`Error` message and closes; :meth:`Connection.receive` returns that Error and
    then raises ConnectionClosed.

    With ``keyring`` every message is tagged with its sending key (the Register too)
    and everything the server sends must carry a valid tag of an accepted key.
    """
    try:
        with trio.fail_after(connect_timeout):
            stream = await trio.open_tcp_stream(host, port, local_address=local_ip)
    except trio.TooSlowError:
        raise TimeoutError(f"connecting to {host}:{port} took more than {connect_timeout:g} s") from None
    if tls_context is not None:
        stream = await _connect_tls(stream, tls_context, expect_uri, counters, connect_timeout, f"{host}:{port}")
    try:
        conn = Connection(stream, counters=counters, max_frame_size=max_frame_size, max_urls=max_urls,
                          max_queue=max_queue, send_timeout=send_timeout, close_timeout=close_timeout,
                          compress=compress, keyring=keyring)
        if not compress:
            register = dataclasses.replace(register, compress=None)
        elif register.compress is None:
            register = dataclasses.replace(register, compress=COMPRESSIONS)
        conn._offered = register.compress is not None
        data = encode(register)
        if keyring is not None:
            data = keyring.sign(data)
        with trio.fail_after(connect_timeout):
            await stream.send_all(data)
        conn._count_sent(data)
    except trio.TooSlowError:
        await trio.aclose_forcefully(stream)
        raise TimeoutError(f"sending register to {host}:{port} took more than {connect_timeout:g} s") from None
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        await trio.aclose_forcefully(stream)
        raise ConnectionResetError(f"connection to {host}:{port} lost while registering: {exc}") from None
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    conn.register = register
    counters.inc("connected")
    return conn


async def _connect_tls(stream: trio.SocketStream, context: ssl.SSLContext, expect_uri: str | None,
                       counters: Counters, timeout: float, where: str) -> trio.SSLStream:
    """The client side of TLS: handshake under a deadline, then the server's
    certificate must name ``expect_uri``. Raises TLSRefused / TimeoutError (closed)."""
    ssl_stream = wrap(stream, context, counters, server_side=False)
    try:
        with trio.fail_after(timeout):
            await ssl_stream.do_handshake()
    except trio.TooSlowError:
        await trio.aclose_forcefully(stream)
        counters.inc("handshake_failed", reason="timeout")
        raise TimeoutError(f"TLS handshake with {where} took more than {timeout:g} s") from None
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        await trio.aclose_forcefully(stream)
        counters.inc("handshake_failed", reason="tls")
        raise TLSRefused("tls", f"TLS handshake with {where} failed: {ssl_error_text(exc)}") from None
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    problem = expected_uri_problem(ssl_stream.getpeercert(), expect_uri) if expect_uri else None
    if problem is not None:
        log.warning("refusing %s: it should be %s, but %s", where, expect_uri, problem)
        counters.inc("handshake_failed", reason="wrong-network")
        await trio.aclose_forcefully(ssl_stream)
        raise TLSRefused("wrong-network", f"{where}: {problem}")
    counters.inc("tls_handshakes")
    return ssl_stream


_jitter = random.Random()


async def connect_forever(
    host: str,
    port: int,
    register: Register,
    on_connected: Handler,
    *,
    local_ip: str | None = None,
    counters: Counters,
    backoff_initial: float = 0.1,
    backoff_max: float = 5.0,
    log_interval: float = 5.0,
    silence_timeout: float | None = None,
    **connect_options: Any,
) -> None:
    """Stay connected: connect, run ``await on_connected(conn)``, reconnect when it ends.

    Runs until cancelled. A failed attempt is counted (``connect_failed``) and logged at
    most once per ``log_interval`` seconds (with the number of failures since the last
    line); the next attempt waits an exponential back-off (``backoff_initial`` doubling up
    to ``backoff_max``) with jitter (a random 50-100 % of it), so that many hosts whose
    center restarts do not reconnect in lock step. The back-off also applies after a
    session ends; it is reset by a session that lasted at least ``backoff_max`` seconds,
    so a server that accepts and immediately drops us is not hammered.

    ``on_connected`` gets a running :class:`Connection`; ConnectionClosed from it is the
    normal end of a session; any other exception is logged with its traceback, counted
    (``session_error``) and followed by a reconnect. ``connect_options`` are passed to
    :func:`connect` (``connect_timeout``, ``max_queue``, ``send_timeout``, ...).

    ``silence_timeout``: a server that sends nothing (heartbeats, or anything else) for
    this long while ``on_connected`` listens is given up: the connection is closed
    (logged, counted ``heartbeat_missed``), so the session ends and we dial again
    (:func:`close_when_silent`). Without it a server that stops answering but keeps its
    TCP connection open (a stopped process, a hung host) is held for as long as our own
    sends find room in the socket buffers, which with little to send is for ever.
    """
    delay = backoff_initial
    last_log = -float("inf")
    failures_unlogged = 0
    while True:
        try:
            conn = await connect(host, port, register, local_ip=local_ip, counters=counters, **connect_options)
        except OSError as exc:
            counters.inc("connect_failed")
            failures_unlogged += 1
            now = trio.current_time()
            if now - last_log >= log_interval:
                log.warning("cannot connect to %s:%d from %s: %s (%d failed attempt(s) since last report); "
                            "retrying", host, port, local_ip or "any address", exc, failures_unlogged)
                last_log = now
                failures_unlogged = 0
        else:
            failures_unlogged = 0
            started = trio.current_time()
            log.info("connected to %s:%d from %s", host, port, local_ip or "any address")
            async with conn:
                if silence_timeout is not None:
                    conn._nursery.start_soon(close_when_silent, conn, silence_timeout, f"{host}:{port}")
                try:
                    await on_connected(conn)
                except BaseException as exc:
                    rest = _without_closed(exc)
                    if rest is not None and not isinstance(rest, Exception):
                        raise rest from None  # Cancelled, KeyboardInterrupt
                    if rest is not None:
                        log.error("session with %s:%d failed", host, port, exc_info=rest)
                        counters.inc("session_error")
            log.info("connection to %s:%d ended (%s); reconnecting", host, port, conn.close_reason)
            if trio.current_time() - started >= backoff_max:
                delay = backoff_initial
        await trio.sleep(delay * _jitter.uniform(0.5, 1.0))
        delay = min(delay * 2, backoff_max)


async def close_when_silent(conn: Connection, timeout: float, name: str) -> None:
    """Close ``conn`` once its peer ``name`` has been silent for ``timeout`` seconds
    (:attr:`Connection.silent_since`), with one log line saying who and for how long.
    Wakes when the silence would reach the timeout; if it wakes later than that, this
    process was paused and the delay is excused (:meth:`Connection.excuse`)."""
    while not conn.closed:
        deadline = conn.silent_since + timeout
        await trio.sleep_until(deadline)
        now = trio.current_time()
        conn.excuse(max(0.0, now - deadline))
        silent = now - conn.silent_since
        if silent >= timeout and not conn.closed:
            conn.counters.inc("heartbeat_missed")
            log.warning("%s sent nothing for %.1f s (heartbeat timeout %g s): giving the connection up and "
                        "dialling again", name, silent, timeout)
            conn._close_now("silent")
            return
