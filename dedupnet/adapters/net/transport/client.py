"""The client side: connect and register, and stay connected (reconnect with back-off,
give up a server that has gone silent).

What the Register offers and what the server's Welcome may answer is
:class:`~.handshake.ClientHandshake`'s (sans I/O); here are the socket, TLS, the
deadlines and the retries.
"""

from __future__ import annotations

import logging
import ssl

import trio

from dedupnet.codec.auth import Keyring
from dedupnet.codec.backoff import Backoff
from dedupnet.codec.errors import SettingsError
from dedupnet.codec.messages import Register
from dedupnet.codec.wire import encode
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.net.tls import TLSRefused, expected_uri_problem, ssl_error_text, wrap

from .connection import Connection, Handler, without_closed
from .handshake import ClientHandshake
from .options import DEFAULT, Options

__all__ = ["connect", "connect_forever", "close_when_silent"]

log = logging.getLogger(__package__)  # one logger for the whole transport, whichever module logs


async def connect(
    host: str,
    port: int,
    register: Register,
    *,
    local_ip: str | None = None,
    counters: Counters,
    options: Options = DEFAULT,
    keyring: Keyring | None = None,
    tls_context: ssl.SSLContext | None = None,
    expect_uri: str | None = None,
    **changes: object,
) -> Connection:
    """Connect to ``host:port`` from ``local_ip`` (if given) and send ``register`` first.

    With ``tls_context`` the connection is TLS (handshake within ``connect_timeout``),
    and with ``expect_uri`` the server's certificate must name it (dedupnet/adapters/net/tls.py:
    ``dedupnet://network/<N>``); otherwise :class:`dedupnet.adapters.net.tls.TLSRefused` (an
    OSError) is raised, logged and counted (``handshake_failed{reason="tls"}`` or
    ``"wrong-network"``).

    With ``compress`` the Register offers ``deflate-stream`` and ``zstd`` (unless
    ``register`` already carries an offer; without ``compress`` any offer is removed);
    the server's :class:`Welcome`, consumed by :meth:`Connection.receive`, turns the
    one it chose on for both directions.
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
    ``options`` (:class:`~.options.Options`, with ``changes`` by field name): limits,
    deadlines and compression.
    """
    options = options.but(**changes)
    timeout = options.connect_timeout
    stream = await _open_tcp(host, port, local_ip, timeout)
    if tls_context is not None:
        stream = await _connect_tls(stream, tls_context, expect_uri, counters, timeout, f"{host}:{port}")
    try:
        conn = Connection(stream, counters=counters, options=options, keyring=keyring)
        await _send_register(conn, ClientHandshake(register, options.compress), timeout)
    except trio.TooSlowError:
        await trio.aclose_forcefully(stream)
        raise TimeoutError(f"sending register to {host}:{port} took more than {timeout:g} s") from None
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        await trio.aclose_forcefully(stream)
        raise ConnectionResetError(f"connection to {host}:{port} lost while registering: {exc}") from None
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    counters.inc("connected")
    return conn


async def _open_tcp(host: str, port: int, local_ip: str | None, timeout: float) -> trio.SocketStream:
    try:
        with trio.fail_after(timeout):
            return await trio.open_tcp_stream(host, port, local_address=local_ip)
    except trio.TooSlowError:
        raise TimeoutError(f"connecting to {host}:{port} took more than {timeout:g} s") from None


async def _send_register(conn: Connection, handshake: ClientHandshake, timeout: float) -> None:
    """The Register, first thing on the connection (tagged if it has a keyring)."""
    conn._client = handshake
    data = encode(handshake.register)
    if conn.keyring is not None:
        data = conn.keyring.sign(data)
    with trio.fail_after(timeout):
        await conn.stream.send_all(data)
    conn._count_sent(data)
    conn.register = handshake.register


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


#: Between two dials of one server. Jittered: when a center restarts, every host that was
#: connected to it dials again at once, and would go on dialling in step.
RECONNECT = Backoff(first=0.1, cap=5.0, jitter=0.5)


async def connect_forever(
    host: str,
    port: int,
    register: Register,
    on_connected: Handler,
    *,
    local_ip: str | None = None,
    counters: Counters,
    backoff: Backoff = RECONNECT,
    log_interval: float = 5.0,
    silence_timeout: float | None = None,
    **connect_options: object,
) -> None:
    """Stay connected: connect, run ``await on_connected(conn)``, reconnect when it ends.

    Runs until cancelled. A failed attempt is counted (``connect_failed``) and logged at
    most once per ``log_interval`` seconds (with the number of failures since the last
    line); the next attempt waits ``backoff`` (:data:`RECONNECT`). The back-off also
    applies after a session ends; it is reset by a session that lasted at least its cap,
    so a server that accepts and immediately drops us is not hammered.

    ``on_connected`` gets a running :class:`Connection`; ConnectionClosed from it is the
    normal end of a session; any other exception is logged with its traceback, counted
    (``session_error``) and followed by a reconnect; a host's Register refused for good
    (:data:`PERMANENT_REFUSALS`) raises :class:`RefusedForGood`. ``connect_options`` are passed to
    :func:`connect` (``options``, ``keyring``, ``connect_timeout``, ``max_queue``, ...).

    ``silence_timeout``: a server that sends nothing (heartbeats, or anything else) for
    this long while ``on_connected`` listens is given up: the connection is closed
    (logged, counted ``heartbeat_missed``), so the session ends and we dial again
    (:func:`close_when_silent`). Without it a server that stops answering but keeps its
    TCP connection open (a stopped process, a hung host) is held for as long as our own
    sends find room in the socket buffers, which with little to send is for ever.
    """
    failures, last_log, failures_unlogged = 0, -float("inf"), 0
    while True:
        try:
            conn = await connect(host, port, register, local_ip=local_ip, counters=counters, **connect_options)
        except OSError as exc:
            counters.inc("connect_failed")
            failures_unlogged += 1
            now = trio.current_time()
            if now - last_log >= log_interval:
                log.warning("cannot connect to %s:%d from %s: %s (%d failures since the last line); retrying "
                            "(check %s)", host, port, local_ip or "any", exc, failures_unlogged, _dialled(register))
                last_log, failures_unlogged = now, 0
        else:
            failures_unlogged = 0
            started = trio.current_time()
            log.info("connected to %s:%d from %s", host, port, local_ip or "any address")
            await _session(conn, on_connected, silence_timeout, f"{host}:{port}")
            refused_for_good(conn, register, f"{host}:{port}")
            log.info("connection to %s:%d ended (%s); reconnecting", host, port, conn.close_reason)
            if trio.current_time() - started >= backoff.cap:
                failures = 0
        failures += 1
        await trio.sleep(backoff.delay(failures))


class RefusedForGood(SettingsError):
    """The center refused this host's Register for a reason no retry can cure (its
    settings and the center's disagree): the host stops, exit status 2, with the
    setting to check, instead of dialling again for ever."""


#: The setting that names the server a client of each role dials, for the log line of a failed dial.
SETTING_OF_ROLE = {"host": "--center, and that the center runs", "center": "--peer, and that the peer runs"}

#: A host's refusals that only a change of settings cures, and the setting to check.
PERMANENT_REFUSALS = {
    "wrong-network": "--network (and --center: is it this network's center?)",
    "host-not-in-lan": "--ip, and the center's --lan",
    "source-mismatch": "--ip: the address this host connects from",
    "bad-tag": "--lan-key-file: the key file of the center's LAN",
    "bad-role": "--center: it names a daemon that takes no hosts",
    "tls": "--lan-tls and --tls-ca: the center's TLS settings for its LAN",
}


def _dialled(register: Register) -> str:
    return SETTING_OF_ROLE.get(register.role, "the address")


def refused_for_good(conn: Connection, register: Register, where: str) -> None:
    """Raise :class:`RefusedForGood` if a host's Register was refused for good: the
    center's first answer was the refusal. A center's peers keep dialling: one peer
    misconfigured must not stop a LAN's center."""
    error = conn.peer_error
    if error is not None:
        reason, text = error.reason, error.message
    elif conn.close_reason == "bad-input:bad-tag" and not conn.received:  # its refusal, without our key's tag
        reason, text = "bad-tag", "its answers are not tagged with this host's LAN key"
    else:
        return
    if register.role == "host" and reason in PERMANENT_REFUSALS:
        raise RefusedForGood(f"the center at {where} refuses this host: {reason}: {text}; check "
                             f"{PERMANENT_REFUSALS[reason]}", reason=reason)


async def _session(conn: Connection, on_connected: Handler, silence_timeout: float | None, where: str) -> None:
    """One connection of :func:`connect_forever`, run until it ends; what
    ``on_connected`` raises is logged and counted, never passed on (but a cancel)."""
    async with conn:
        if silence_timeout is not None:
            conn._nursery.start_soon(close_when_silent, conn, silence_timeout, where)
        try:
            await on_connected(conn)
        except BaseException as exc:
            rest = without_closed(exc)
            if rest is not None and not isinstance(rest, Exception):
                raise rest from None  # Cancelled, KeyboardInterrupt
            if rest is not None:
                log.error("session with %s failed", where, exc_info=rest)
                conn.counters.inc("session_error")


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
