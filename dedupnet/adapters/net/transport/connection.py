"""One framed connection: a decoding receiver, a bounded queue and its writer task.

The I/O around the sans-I/O codec (:mod:`dedupnet.codec.wire`) for one stream, either
side: what :func:`~.server.serve` hands its handler and :func:`~.client.connect`
returns. Why it is shaped as it is (a stalled peer blocks no one, bad input costs one
connection, urgent messages skip the queue, one conversion per broadcast) is told in
the package's docstring, :mod:`dedupnet.adapters.net.transport`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import math
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import trio

from dedupnet.codec.auth import Keyring
from dedupnet.codec.errors import ProtocolError
from dedupnet.codec.messages import STREAM_COMPRESSION, Error, Frame, Message, Register, Welcome, normalize_ip
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.net.ratelimit import LogLimiter, TokenBucket
from dedupnet.codec.wire import HEADER_SIZE, NEED_DATA, Decoder, Deflater, encode, is_compressed

from .forms import _recode, _sent_kinds, _signed
from .handshake import ClientHandshake, kind_name, unexpected_welcome
from .options import DEFAULT, Options

__all__ = ["Connection", "ConnectionClosed", "Handler", "peer_ip", "without_closed"]

log = logging.getLogger(__package__)  # one logger for the whole transport, whichever module logs

RECEIVE_CHUNK = 64 * 1024  # bytes per receive_some
LINGER_BYTES = 256 * 1024  # input read and discarded after an Error (see _linger)
MAX_ERROR_MESSAGE = 1000  # characters of the Error message we send (schema allows 4096)

Handler = Callable[["Connection"], Awaitable[None]]


class ConnectionClosed(Exception):
    """The connection is closed (by the peer, by bad input, a timeout, an overflow or us).

    Handlers may let it escape: :func:`serve` and :func:`connect_forever` treat it as the
    normal end of a connection.
    """


def peer_ip(address: Any) -> str:
    """The peer's IP in canonical text; IPv4-mapped IPv6 (dual-stack sockets) as IPv4."""
    host = address[0] if isinstance(address, tuple) else str(address)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host  # e.g. a scoped IPv6 address; compared as given
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return normalize_ip(host)


def without_closed(exc: BaseException) -> BaseException | None:
    """``exc`` minus its ConnectionClosed parts, None if nothing else is left. A handler
    with its own nursery reports ConnectionClosed inside an exception group."""
    if isinstance(exc, ConnectionClosed):
        return None
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(ConnectionClosed)[1]
    return exc


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
            (dedupnet/adapters/net/tls.py); the peer address is always the socket's.
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
        compression: the compression negotiated with the peer (``"deflate-stream"``:
            each direction one deflate stream from its Welcome on; ``"zstd"``: large
            bodies compressed one by one), or None: then only plain bodies are sent to
            it, and a compressed one from it is bad input.
        keyring: the :class:`~dedupnet.codec.auth.Keyring` that tags what is sent and must
            verify what is received, or None (no authentication on this connection).

        options: the :class:`~.options.Options` it runs with.

    Use it as an async context manager (see :mod:`dedupnet.adapters.net.transport`); the writer runs only
    inside the ``async with`` block. Messages queued before entering are sent once the
    writer starts.
    """

    def __init__(self, stream: trio.abc.Stream, *, counters: Counters, options: Options = DEFAULT,
                 keyring: Keyring | None = None, log_limit: LogLimiter | None = None) -> None:
        if options.max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {options.max_queue}")
        self.stream, self.counters, self.options = stream, counters, options
        self._socket = _socket_of(stream)
        self.tls = isinstance(stream, trio.SSLStream)
        self.peer_cert: dict | None = stream.getpeercert() if self.tls else None
        address = self._socket.getpeername()  # OSError if the peer is already gone
        self.peer_ip = peer_ip(address)
        port = address[1] if isinstance(address, tuple) and len(address) > 1 else 0
        self.peer = f"[{self.peer_ip}]:{port}" if ":" in self.peer_ip else f"{self.peer_ip}:{port}"
        self.register: Register | None = None
        self.close_reason: str | None = None
        self.peer_error: Error | None = None  # an Error that came first: a refused Register (not one later)
        self.received = 0  # messages received, a Welcome aside
        self.send_timeout = options.send_timeout
        self.close_timeout = options.close_timeout
        self.error_timeout = options.error_timeout
        self.compress = options.compress
        self.compression: str | None = None
        self._client: ClientHandshake | None = None  # client: our offer, and whether it was answered
        #: Tags what we send and is required on what we receive (None: no authentication).
        self.keyring = keyring
        self._decoder = Decoder(options.max_frame_size, options.max_urls, allow_compressed=False, keyring=keyring)
        now = trio.current_time()
        self._byte_bucket, self._message_bucket = _buckets(options, now)
        self._compressed_seen = 0
        #: deflate-stream: what we send goes through it once the writer has written
        #: ``_deflate_after`` (the server's Welcome) or, on a client, ``_switch`` (its
        #: Welcome saying so, written just before the first message it sends after the
        #: server's: a client with nothing to say writes nothing).
        self._deflater: Deflater | None = None
        self._deflate_after: bytes | None = None
        self._switch: bytes | None = None
        self._switch_expected = False  # server: the client's Welcome that switches its side
        self._send_ch, self._recv_ch = trio.open_memory_channel[bytes](options.max_queue)
        self._urgent: bytes | None = None  # the priority lane: one slot, newest wins
        self._held: bytes | None = None  # taken from the queue, sent after the urgent one
        #: trio time the last message went out whole (or the connection was made): a
        #: link that carries messages needs no heartbeat, any message is one.
        self.last_sent = now
        #: trio time our last heartbeat went on it (runtime.beat): a new link hears one at once.
        self.last_beat = -math.inf
        self.beats = 0  # heartbeats sent (dedupnet/adapters/runtime.py beat)
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
        here, under the server's per-source budget (:class:`~dedupnet.adapters.net.ratelimit.LogLimiter`)."""
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
                    self._count_sent(data, await self._write(data))
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
                    self.received += 1
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

    def _welcome(self, welcome: Welcome, compression: str | None) -> None:
        """Server side: answer the client's offer; with ``deflate-stream`` what we send
        after this Welcome is compressed, and what it sends after its own Welcome."""
        data = self._prepare(encode(welcome))
        if compression == STREAM_COMPRESSION:
            self._deflate_after = data
            self._switch_expected = True
        self.compression = compression
        self._decoder.allow_compressed = compression == "zstd"
        self._queue(data)  # the first message

    def _on_welcome(self, msg: Welcome) -> None:
        """A Welcome: the server's answer to our offer (client side), or, on a server
        that chose ``deflate-stream``, the client's switch (once); anywhere else it is
        bad input."""
        if self._switch_expected and msg.compress == (STREAM_COMPRESSION,):
            self._switch_expected = False
            self._decoder.start_inflate()
            return
        if self._client is None:
            raise unexpected_welcome()
        compression = self._client.welcome(msg)
        self.compression = compression
        if compression == STREAM_COMPRESSION:
            self._decoder.start_inflate()  # the server's bytes after its Welcome
            self._switch = self._prepare(encode(Welcome((compression,))))
        elif compression is not None:
            self._decoder.allow_compressed = True
        log.debug("%s: %s negotiated", self.peer, compression)

    def _count_received(self, msg: Message) -> None:
        if self._decoder.compressed_messages != self._compressed_seen:
            self._compressed_seen = self._decoder.compressed_messages
            self.counters.inc("compressed_received")
        if type(msg) is Frame:
            self.counters.inc("frames_received", kind="frame", flag=str(msg.flag))
            return
        self.counters.inc("frames_received", kind=kind_name(msg.KIND))
        if type(msg) is Error:
            if not self.received:
                self.peer_error = msg
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
        data = _recode(data, self.compression == "zstd")
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
        return self._queue(self._prepare(data))

    def _queue(self, data: bytes) -> bool:
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

    def _count_sent(self, data: bytes, wire_size: int | None = None) -> None:
        """Count ``data`` as sent, ``wire_size`` bytes once deflated (each kind's share
        in proportion to its plain size)."""
        sent = len(data) if wire_size is None else wire_size
        plain = shared = 0
        for kind, size in _sent_kinds(data):
            self.counters.inc("frames_sent", kind=kind)
            if wire_size is not None:  # its share, rounded so that the shares add up to what was sent
                plain += size
                size, shared = sent * plain // len(data) - shared, sent * plain // len(data)
            self.counters.inc("sent_kind_bytes", size, kind=kind)
        self.counters.inc("sent_bytes", sent)
        if self.tls:
            self.counters.inc("tls_payload_sent_bytes", sent)
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


    async def _write(self, data: bytes) -> int | None:
        """Send ``data`` as this direction's stream has it: deflated once switched (the
        size then sent is returned; None: sent plain)."""
        switch = b""
        if self._deflater is None:
            if self._switch is None:
                await self.stream.send_all(data)
                if data is self._deflate_after:
                    self._deflater, self._deflate_after = Deflater(), None
                return None
            switch, self._switch, self._deflater = self._switch, None, Deflater()
            self._count_sent(switch)
        out = self._deflater.compress(data)
        await self.stream.send_all(switch + out if switch else out)
        return len(out)

    async def _writer(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Send the urgent slot first, then queued bytes in order, until the queue is
        closed. Never raises: any failure closes the connection, which the receiving side
        then sees as ConnectionClosed."""
        self._writer_running = True
        task_status.started()
        try:
            while (data := await self._next_to_send()) is not None:
                with trio.move_on_after(self.send_timeout) as scope:
                    wire_size = await self._write(data)
                if scope.cancelled_caught:
                    if self._closed:
                        return  # closed meanwhile (e.g. send() timed out at the same moment)
                    self.note(logging.WARNING, "%s took no data for %.1f s: closing the connection", self.peer,
                              self.send_timeout)
                    self.counters.inc("send_timeout")
                    self._close_now("send-timeout")
                    return
                self.last_sent = trio.current_time()
                self._count_sent(data, wire_size)
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


def _buckets(options: Options, now: float) -> tuple[TokenBucket | None, TokenBucket | None]:
    """The token buckets on the bytes and the messages a connection reads (None: no
    limit). A burst must hold at least one whole frame of the largest size, or it could
    never be read."""
    o = options
    byte_bucket = None if not o.max_bytes_per_s else TokenBucket(
        o.max_bytes_per_s, max(o.burst_bytes or o.max_bytes_per_s, HEADER_SIZE + o.max_frame_size + 255), now)
    message_bucket = None if not o.max_messages_per_s else TokenBucket(
        o.max_messages_per_s, max(o.burst_messages or o.max_messages_per_s, 1), now)
    return byte_bucket, message_bucket
