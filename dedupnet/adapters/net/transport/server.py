"""The server side: listen, accept, hold each source to its share, TLS, and the handshake.

:func:`serve` runs a handler per registered connection. What it decides about a
client's Register is :class:`~.handshake.ServerHandshake`'s (sans I/O); here are the
socket, the deadlines, TLS accept, the per-source limit, and the log lines and counters
for what was refused. A flood of connections cannot flood the log: every line about a
connection goes through the listener's :class:`~dedupnet.adapters.net.ratelimit.LogLimiter`.
"""

from __future__ import annotations

import logging

import trio

from dedupnet.codec.auth import Keyring
from dedupnet.codec.messages import Register
from dedupnet.adapters.net.listen import open_listeners
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.net.ratelimit import LogLimiter
from dedupnet.adapters.net.tls import ServerTLS, sniff_tls, ssl_error_text, wrap

from .connection import Connection, ConnectionClosed, Handler, peer_ip, without_closed
from .handshake import Accepted, Peer, RegisterTags, ServerHandshake
from .options import DEFAULT, Options

__all__ = ["serve"]

log = logging.getLogger(__package__)  # one logger for the whole transport, whichever module logs


async def serve(
    host: str | None,
    port: int,
    handler: Handler,
    *,
    counters: Counters,
    options: Options = DEFAULT,
    accept_roles: tuple[str, ...] = ("host", "center"),
    verify_source: bool = True,
    keyrings: dict[str, Keyring | None] | None = None,
    tls: ServerTLS | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    **changes: object,
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

    With ``tls`` (:class:`dedupnet.adapters.net.tls.ServerTLS`) a client that starts with a TLS
    handshake gets one (within ``handshake_timeout``; failures are
    ``handshake_failed{reason="tls"}``), a plain client is refused at its Register if
    its role must use TLS, and a certificate that names another network is refused
    (``wrong-network``): ``tls.check``.

    ``port`` 0 picks a free port; the bound port is reported through ``task_status``:
    ``port = await nursery.start(partial(serve, counters=c), "127.0.0.1", 0, handler)``.
    ``host`` None listens on all addresses (IPv4 and IPv6; peers' IPv4-mapped addresses
    are reported as IPv4). Runs until cancelled.

    ``keyrings`` (role -> :class:`~dedupnet.codec.auth.Keyring`): the roles that must tag
    every message (see :mod:`dedupnet.adapters.net.transport`); a Register tagged with no
    accepted key, or not with its own role's key, is ``bad_input{reason="bad-tag"}`` and
    refused. ``options`` (:class:`~.options.Options`, with ``changes`` by field name):
    limits, deadlines and compression; ``max_connections_per_source`` closes a further
    connection of a source at once (``handshake_failed{reason="too-many"}``), and the
    rates throttle what each connection is read at (:class:`TokenBucket`).
    """
    options = options.but(**changes)
    listeners = await open_listeners(host, port, "--listen")
    bound = listeners[0].socket.getsockname()[1]
    log.info("listening on %s:%d", host or "*", bound)
    rules = ServerHandshake(accept_roles, verify_source=verify_source, keyrings=keyrings, tls=tls,
                            compress=options.compress, timeout=options.handshake_timeout)
    server = _Server(handler, counters, options, rules)
    task_status.started(bound)
    await trio.serve_listeners(server.accept, listeners)


class _PerSource:
    """Connections open per source address, held to ``limit`` (None: no limit)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.open: dict[str, int] = {}

    def enter(self, source: str | None) -> bool:
        """Count one more connection of ``source``; False (not counted) if it has its share."""
        if self.limit is None or source is None:
            return True
        held = self.open.get(source, 0)
        if held >= self.limit:
            return False
        self.open[source] = held + 1
        return True

    def leave(self, source: str | None) -> None:
        if self.limit is None or source is None:
            return
        left = self.open[source] - 1
        if left:
            self.open[source] = left
        else:
            del self.open[source]


class _Server:
    """One listener's accepted connections: each is opened (TLS if the client starts
    with it), handshaken, handed to the handler and closed."""

    def __init__(self, handler: Handler, counters: Counters, options: Options, rules: ServerHandshake) -> None:
        self.handler = handler
        self.counters = counters
        self.options = options
        self.rules = rules
        self.log_limit = LogLimiter(counters)
        self.per_source = _PerSource(options.max_connections_per_source)

    def _note(self, source: str | None, level: int, msg: str, *args: object) -> None:
        """A log line about a connection that has no :class:`Connection` yet."""
        self.log_limit.log(log, level, source, msg, *args)

    async def accept(self, stream: trio.SocketStream) -> None:
        try:
            source = peer_ip(stream.socket.getpeername())
        except OSError:
            source = None
        if not self.per_source.enter(source):
            self.counters.inc("handshake_failed", reason="too-many")
            self._note(source, logging.WARNING, "refused a connection from %s: it has %d open already "
                       "(max_connections_per_source)", source, self.per_source.limit)
            await trio.aclose_forcefully(stream)
            return
        try:
            await self._serve_one(stream, source)
        finally:
            self.per_source.leave(source)

    async def _serve_one(self, stream: trio.SocketStream, source: str | None) -> None:
        """One accepted connection: handshake, handler, close. Never raises except Cancelled."""
        try:
            conn = await self._open(stream, source)
            if conn is None:
                return
            tags = self.rules.tags()
            if tags is not None:
                conn._decoder.verify_tag = tags
                conn._decoder.tag_len_required = tags.tag_len_required
            async with conn:
                if await self._handshake(conn, tags):
                    await self._run_handler(conn)
        except Exception:  # a bug in this module: still never take the server down
            log.exception("internal error serving %s", stream)
            self.counters.inc("handler_error")
            await trio.aclose_forcefully(stream)

    async def _open(self, stream: trio.SocketStream, source: str | None) -> Connection | None:
        """The connection over the accepted stream (TLS if the client starts with it);
        None if it failed or the client left (logged, counted, closed)."""
        accepted: trio.abc.Stream | None = stream
        if self.rules.tls is not None:
            accepted = await self._accept_tls(stream)
            if accepted is None:
                return None
        try:
            conn = Connection(accepted, counters=self.counters, options=self.options, log_limit=self.log_limit)
        except OSError as exc:  # the peer left before we could look at it
            self._note(source, logging.INFO, "accepted connection vanished: %s", exc)
            self.counters.inc("handshake_failed", reason="closed")
            await trio.aclose_forcefully(accepted)
            return None
        self.counters.inc("connections_accepted")
        return conn

    async def _accept_tls(self, stream: trio.SocketStream) -> trio.abc.Stream | None:
        """The stream to read from: an SSLStream after its handshake if the peer starts
        with TLS, the stream itself if it speaks plain dedupnet (whether its role may is
        decided at its Register); None if it failed (logged, counted, closed). Peek and
        handshake together have ``handshake_timeout`` seconds (a slow client holds a
        connection no longer than one that never registers)."""
        assert self.rules.tls is not None
        counters, timeout = self.counters, self.options.handshake_timeout
        try:
            address = stream.socket.getpeername()
            source = peer_ip(address)
            peer = f"{source}:{address[1]}"
        except (OSError, IndexError, TypeError):
            source, peer = None, "a client that left"
        reason = text = None
        with trio.move_on_after(timeout):
            try:
                is_tls = await sniff_tls(stream.socket)
            except OSError as exc:
                is_tls, reason, text = None, "closed", str(exc)
            if is_tls is None:
                reason, text = reason or "closed", text or "closed before the first byte"
            elif not is_tls:
                return stream
            else:
                ssl_stream = wrap(stream, self.rules.tls.context, counters, server_side=True)
                try:
                    await ssl_stream.do_handshake()
                    counters.inc("tls_handshakes")
                    return ssl_stream
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    reason, text = "tls", f"TLS handshake failed: {ssl_error_text(exc)}"
        if reason is None:
            reason, text = "timeout", f"no TLS handshake within {timeout:g} s"
        self._note(source, logging.WARNING, "handshake with %s failed: %s: %s", peer, reason, text)
        counters.inc("handshake_failed", reason=reason)
        await trio.aclose_forcefully(stream)
        return None

    async def _handshake(self, conn: Connection, tags: RegisterTags | None) -> Register | None:
        """The peer's Register, once accepted and answered; otherwise None (logged,
        counted, the peer told why, the connection closed)."""
        verdict = await self._judge_first(conn, tags)
        if verdict is None:
            return None
        if type(verdict) is not Accepted:
            if verdict.bad_tag:
                conn.note(logging.WARNING, "bad input from %s: bad-tag: %s", conn.peer, verdict.text)
                self.counters.inc("bad_input", reason="bad-tag")
            else:
                conn.note(logging.WARNING, "handshake with %s failed: %s: %s", conn.peer, verdict.reason, verdict.text)
            self.counters.inc("handshake_failed", reason=verdict.reason)
            if verdict.keyring is not None:  # a keyed client reads our Error only if it is tagged
                conn._use_keyring(verdict.keyring)
            await conn.close_with_error(verdict.error_reason, verdict.text)
            return None
        register = verdict.register
        if self.rules.keyrings:
            conn._use_keyring(verdict.keyring)
        conn.register = register
        # A control client (`dedupnet status`, a center's census of its hosts) comes and goes
        # every few seconds: a line each only at DEBUG.
        conn.note(logging.DEBUG if register.role == "control" else logging.INFO,
                  "%s registered: role %s, network %d, listen %s", conn.peer, register.role, register.network,
                  register.listen)
        if verdict.welcome is not None:
            conn._welcome(verdict.welcome, verdict.compression)
        return register

    async def _judge_first(self, conn: Connection, tags: RegisterTags | None):
        """The verdict on the first message (or on its absence by the deadline); None if
        the peer closed or sent bad input first (counted; bad input was logged by receive)."""
        msg = None
        with trio.move_on_after(self.options.handshake_timeout):
            try:
                msg = await conn.receive()
            except ConnectionClosed:
                if conn.close_reason and conn.close_reason.startswith("bad-input"):
                    self.counters.inc("handshake_failed", reason="bad-input")
                else:
                    conn.note(logging.INFO, "%s closed the connection before registering", conn.peer)
                    self.counters.inc("handshake_failed", reason="closed")
                return None
        return self.rules.judge(msg, Peer(conn.peer_ip, conn.tls, conn.peer_cert), tags)

    async def _run_handler(self, conn: Connection) -> None:
        try:
            await self.handler(conn)
        except BaseException as exc:
            rest = without_closed(exc)
            if rest is not None and not isinstance(rest, Exception):
                raise rest from None  # Cancelled, KeyboardInterrupt: not ours to handle
            if rest is not None:
                conn.note(logging.ERROR, "handler for %s failed", conn.peer, exc_info=rest)
                self.counters.inc("handler_error")
                conn._close_now("local")
