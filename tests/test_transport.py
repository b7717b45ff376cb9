"""trio transport and metrics over real TCP on loopback (127.0.0.0/8), no mocks.

Timeout paths run on trio's MockClock (the ``autojump_clock`` fixture): when every task
is blocked the clock jumps to the next deadline, so a 5 s handshake timeout takes no real
time. Loopback delivery on Linux is complete when ``send`` returns, so real sockets do not
make the clock jump early. Every wait is under ``trio.fail_after``.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import re
import socket
from functools import partial

import orjson
import pytest
import trio
import trio.testing

from dedupnet.codec import wire
from dedupnet.codec.backoff import Backoff
from dedupnet.codec.messages import COMPRESSIONS, Error, Frame, Heartbeat, Kind, Status, Task
from dedupnet.adapters.monitor.metrics import CONTENT_TYPE, Counters, render_prometheus, serve_metrics
from dedupnet.adapters.monitor.metric_catalog import METRICS
from dedupnet.adapters.net.transport import Connection, ConnectionClosed, connect, connect_forever
from dedupnet.harness.prometheus_text import REFERENCE, parse_prometheus, reference_counters
from dedupnet.codec.wire import Decoder, encode

from .helpers import echo, free_port, raw_exchange, reg, start_server

SERVER = "127.0.0.1"
GOOD_IP = "127.0.0.5"  # the well-behaved client
BAD_IP = "127.0.0.9"  # the misbehaving one
T = "dedupnet.adapters.net.transport"


async def round_trip(conn: Connection, msg) -> None:
    """Send ``msg`` and expect it echoed back."""
    with trio.fail_after(10):
        await conn.send(encode(msg))
        assert await conn.receive() == msg


def lines(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == T and text in r.getMessage()]


def frame(ip: str = GOOD_IP, flag: int = 1, n: int = 3) -> Frame:
    return Frame({f"http://site{i}.test/page": 0 for i in range(n)}, ip, 42, flag)


# --- handshake, source binding, echo ------------------------------------------------------


async def test_handshake_and_echo_both_ways_with_bound_source():
    server_counters, client_counters = Counters(), Counters()
    seen: list[Connection] = []

    async def handler(conn: Connection) -> None:
        seen.append(conn)
        conn.send_nowait(encode(Status(True)))  # server speaks first
        await echo(conn)

    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, handler, server_counters)
        with trio.fail_after(10):
            async with await connect(SERVER, port, reg(GOOD_IP), local_ip=GOOD_IP,
                                     counters=client_counters) as conn:
                assert await conn.receive() == Status(True)
                await round_trip(conn, frame())
                await round_trip(conn, Heartbeat(GOOD_IP, 1700000000.5))
                await round_trip(conn, Task(7, ("http://a.test/", "http://b.test/")))
                assert conn.send_nowait(encode(frame(flag=3)))
                assert await conn.receive() == frame(flag=3)
        nursery.cancel_scope.cancel()

    [server_conn] = seen
    assert server_conn.peer_ip == GOOD_IP
    assert server_conn.register == dataclasses.replace(reg(GOOD_IP), compress=COMPRESSIONS)  # offered by default
    assert conn.peer_ip == SERVER and conn.closed
    assert server_counters.get("connections_accepted") == 1
    assert server_counters.get("frames_received", kind="register") == 1
    assert server_counters.get("frames_received", kind="frame", flag="1") == 1
    assert server_counters.get("frames_received", kind="frame", flag="3") == 1
    assert server_counters.get("frames_sent", kind="status") == 1
    assert client_counters.get("frames_sent", kind="register") == 1
    assert client_counters.get("frames_sent", kind="frame") == 2
    assert client_counters.get("frames_received", kind="frame", flag="3") == 1
    assert client_counters.get("frames_received", kind="heartbeat") == 1
    # Everything the client wrote was read by the server (it echoed all of it) and back.
    assert client_counters.get("sent_bytes") == server_counters.get("received_bytes") > 0
    assert server_counters.get("sent_bytes") == client_counters.get("received_bytes") > 0
    # The bytes by kind add up to the whole (the report's "where the bytes go").
    for counters in (client_counters, server_counters):
        assert counters.total("sent_kind_bytes") == counters.get("sent_bytes")
    assert client_counters.get("sent_kind_bytes", kind="frame") > 0 and client_counters.get("sent_kind_bytes", kind="register") > 0
    assert server_counters.total("handshake_failed") == 0
    assert server_counters.total("bad_input") == 0


async def test_register_ip_other_than_source_is_rejected(caplog):
    caplog.set_level(logging.INFO, logger=T)
    counters = Counters()
    called = []

    async def handler(conn):
        called.append(conn)

    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, handler, counters)
        with trio.fail_after(10):
            async with await connect(SERVER, port, reg("127.0.0.6"), local_ip=GOOD_IP, counters=Counters()) as conn:
                msg = await conn.receive()
                assert isinstance(msg, Error) and msg.reason == "source-mismatch"
                assert "127.0.0.6" in msg.message and GOOD_IP in msg.message
                with pytest.raises(ConnectionClosed):
                    await conn.receive()
        nursery.cancel_scope.cancel()
    assert called == []
    assert counters.get("handshake_failed", reason="source-mismatch") == 1
    [line] = lines(caplog, "handshake with")
    assert "source-mismatch" in line and GOOD_IP in line
    assert len(lines(caplog, "sent error: source-mismatch")) == 1  # the client logs what it was told


async def test_verify_source_off_and_accepted_roles():
    counters = Counters()

    async with trio.open_nursery() as nursery:
        lax = await start_server(nursery, echo, counters, verify_source=False)
        centers_only = await start_server(nursery, echo, counters, accept_roles=("center",))
        with trio.fail_after(10):
            async with await connect(SERVER, lax, reg("127.0.0.6"), local_ip=GOOD_IP, counters=Counters()) as conn:
                await round_trip(conn, frame())
            async with await connect(SERVER, centers_only, reg(GOOD_IP), local_ip=GOOD_IP,
                                     counters=Counters()) as conn:
                msg = await conn.receive()
                assert isinstance(msg, Error) and msg.reason == "bad-role"
            async with await connect(SERVER, centers_only, reg(GOOD_IP, "center"), local_ip=GOOD_IP,
                                     counters=Counters()) as conn:
                await round_trip(conn, frame())
        nursery.cancel_scope.cancel()
    assert counters.get("handshake_failed", reason="bad-role") == 1
    assert counters.total("handshake_failed") == 1


async def test_messages_queued_before_a_handler_returns_are_flushed():
    async def handler(conn):
        for n in range(3):
            assert conn.send_nowait(encode(Task(n, ())))

    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, handler, Counters())
        with trio.fail_after(10):
            async with await connect(SERVER, port, reg(GOOD_IP), local_ip=GOOD_IP, counters=Counters()) as conn:
                assert [await conn.receive() for _ in range(3)] == [Task(0, ()), Task(1, ()), Task(2, ())]
                with pytest.raises(ConnectionClosed):
                    await conn.receive()
                assert conn.close_reason == "eof"
        nursery.cancel_scope.cancel()


async def test_receive_timeout_keeps_the_connection():
    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, echo, Counters())
        with trio.fail_after(10):
            async with await connect(SERVER, port, reg(GOOD_IP), local_ip=GOOD_IP, counters=Counters()) as conn:
                with pytest.raises(trio.TooSlowError):
                    await conn.receive(timeout=0.05)
                assert not conn.closed
                await round_trip(conn, frame())
        nursery.cancel_scope.cancel()


# --- malformed input: one connection pays, the others are served --------------------------

FLAG_4 = wire.pack(Kind.FRAME, orjson.dumps({"URL_set": {"http://a.test/": 0}, "IP": BAD_IP, "number": 1, "flag": 4}))

MALFORMED = [
    # (id, bytes, counter name, counter labels, Error reason, log text)
    ("garbage", b"\x00\xff\x13garbage" * 10, "bad_input", {"reason": "bad-magic"}, "bad-magic", "bad input from"),
    # More than the server reads before it gives up: it must still deliver the Error (no reset).
    ("garbage-flood", b"\x00" * 300_000, "bad_input", {"reason": "bad-magic"}, "bad-magic", "bad input from"),
    ("http", b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "bad_input", {"reason": "bad-magic"},
     "bad-magic", "bad input from"),
    ("oversized", wire.header(Kind.FRAME, 1_000_000_000), "bad_input", {"reason": "too-large"}, "too-large",
     "bad input from"),
    ("bad-json", wire.pack(Kind.REGISTER, b'{"IP": "127.0.0.9", oops'), "bad_input", {"reason": "bad-json"},
     "bad-json", "bad input from"),
    ("flag-4", FLAG_4, "bad_input", {"reason": "bad-flag"}, "bad-flag", "bad input from"),
    ("not-register", encode(Heartbeat(BAD_IP, 1.0)), "handshake_failed", {"reason": "not-register"},
     "not-register", "handshake with"),
    ("after-handshake", encode(reg(BAD_IP)) + FLAG_4, "bad_input", {"reason": "bad-flag"}, "bad-flag",
     "bad input from"),
]


@pytest.mark.parametrize("data, name, labels, reason, text", [m[1:] for m in MALFORMED],
                         ids=[m[0] for m in MALFORMED])
async def test_malformed_input_closes_only_that_connection(caplog, data, name, labels, reason, text):
    caplog.set_level(logging.INFO, logger=T)
    counters = Counters()
    handler_ended = []

    async def handler(conn):
        try:
            await echo(conn)
        finally:
            handler_ended.append(conn.register.IP)

    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, handler, counters)
        with trio.fail_after(20):
            async with await connect(SERVER, port, reg(GOOD_IP), local_ip=GOOD_IP, counters=Counters()) as good:
                await round_trip(good, frame())
                received = await raw_exchange(port, data, BAD_IP)
                await round_trip(good, frame(flag=2))
                assert not good.closed
        nursery.cancel_scope.cancel()

    assert [type(m) for m in received] == [Error]
    assert received[0].reason == reason
    assert counters.get(name, **labels) == 1
    bad_lines = lines(caplog, text)
    assert len(bad_lines) == 1, bad_lines
    assert BAD_IP in bad_lines[0] and reason in bad_lines[0]
    if name == "bad_input":
        assert re.fullmatch(rf"bad input from {re.escape(BAD_IP)}:\d+: {reason}: .+", bad_lines[0])
    # A connection that never registered never reaches the handler.
    assert handler_ended.count(BAD_IP) == (1 if data.startswith(encode(reg(BAD_IP))) else 0)
    assert counters.get("frames_received", kind="frame", flag="2") == 1  # the good client after it


async def test_silence_past_handshake_timeout(caplog, autojump_clock):
    caplog.set_level(logging.INFO, logger=T)
    counters = Counters()
    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, echo, counters, handshake_timeout=5.0)
        with trio.fail_after(60):
            async with await connect(SERVER, port, reg(GOOD_IP), local_ip=GOOD_IP, counters=Counters()) as good:
                await round_trip(good, frame())
                started = trio.current_time()
                received = await raw_exchange(port, b"", BAD_IP)  # connects and says nothing
                assert trio.current_time() - started >= 5.0
                # The good client was connected all along, past the same deadline.
                await round_trip(good, frame(flag=3))
        nursery.cancel_scope.cancel()
    assert [m.reason for m in received] == ["timeout"]
    assert counters.get("handshake_failed", reason="timeout") == 1
    assert len(lines(caplog, "handshake with")) == 1


async def test_peer_closing_before_register_is_counted(caplog):
    caplog.set_level(logging.INFO, logger=T)
    counters = Counters()
    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, echo, counters)
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream(SERVER, port, local_address=BAD_IP)
            await stream.send_all(wire.header(Kind.REGISTER, 100)[:10])  # part of a header, then EOF
            await stream.send_eof()
            assert await stream.receive_some(65536) != b""  # an Error: truncated
            await stream.aclose()
            # A connection that just closes counts as "closed".
            stream = await trio.open_tcp_stream(SERVER, port, local_address=BAD_IP)
            await stream.aclose()
            while counters.get("handshake_failed", reason="closed") < 1:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert counters.get("bad_input", reason="truncated") == 1
    assert counters.get("handshake_failed", reason="bad-input") == 1


async def test_handler_exception_is_logged_and_server_keeps_serving(caplog):
    caplog.set_level(logging.INFO, logger=T)
    counters = Counters()

    async def handler(conn):
        if conn.register.IP == BAD_IP:
            raise RuntimeError("bug in one handler")
        await echo(conn)

    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, handler, counters)
        with trio.fail_after(10):
            async with await connect(SERVER, port, reg(BAD_IP), local_ip=BAD_IP, counters=Counters()) as bad:
                with pytest.raises(ConnectionClosed):
                    await bad.receive()
            async with await connect(SERVER, port, reg(GOOD_IP), local_ip=GOOD_IP, counters=Counters()) as good:
                await round_trip(good, frame())
        nursery.cancel_scope.cancel()
    assert counters.get("handler_error") == 1
    [record] = [r for r in caplog.records if "handler for" in r.getMessage()]
    assert record.exc_info is not None and "bug in one handler" in str(record.exc_info[1])


async def test_connection_closed_inside_a_handlers_nursery_is_a_normal_end(caplog):
    caplog.set_level(logging.INFO, logger=T)
    counters = Counters()
    ended = trio.Event()

    async def handler(conn):
        try:
            async with trio.open_nursery() as nursery:  # reports ConnectionClosed in a group
                nursery.start_soon(echo, conn)
                nursery.start_soon(trio.sleep_forever)
        finally:
            ended.set()

    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, handler, counters)
        with trio.fail_after(10):
            async with await connect(SERVER, port, reg(GOOD_IP), local_ip=GOOD_IP, counters=Counters()) as conn:
                await round_trip(conn, frame())
            await ended.wait()
            await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert counters.get("handler_error") == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_client_side_bad_input(caplog):
    """The client's Connection treats a misbehaving server the same way."""
    caplog.set_level(logging.INFO, logger=T)
    counters = Counters()
    got_from_client: list = []

    async def bad_server(stream: trio.SocketStream) -> None:
        decoder = Decoder()
        with trio.fail_after(10):
            while not got_from_client:
                decoder.feed(await stream.receive_some(65536))
                got_from_client.extend(decoder)
            await stream.send_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            while chunk := await stream.receive_some(65536):
                decoder.feed(chunk)
                got_from_client.extend(decoder)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        [listener] = await trio.open_tcp_listeners(0, host=SERVER)
        port = listener.socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, bad_server, [listener])
        with trio.fail_after(10):
            async with await connect(SERVER, port, reg(GOOD_IP), local_ip=GOOD_IP, counters=counters) as conn:
                with pytest.raises(ConnectionClosed):
                    await conn.receive()
                assert conn.closed and conn.close_reason == "bad-input:bad-magic"
            while len(got_from_client) < 2:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert got_from_client[0] == dataclasses.replace(reg(GOOD_IP), compress=COMPRESSIONS)
    assert isinstance(got_from_client[1], Error) and got_from_client[1].reason == "bad-magic"
    assert counters.get("bad_input", reason="bad-magic") == 1
    assert len(lines(caplog, "bad input from 127.0.0.1:")) == 1


# --- back-pressure --------------------------------------------------------------------------

BIG = encode(Task(1, tuple(f"http://site.test/{i:06d}" for i in range(2500))))  # ~60 KB


async def test_send_nowait_overflow_on_a_peer_that_never_reads(caplog):
    caplog.set_level(logging.INFO, logger=T)
    assert not inspect.iscoroutinefunction(Connection.send_nowait)  # cannot block by construction
    counters = Counters()
    result: dict = {}
    done = trio.Event()

    async def handler(conn):
        if conn.register.IP == GOOD_IP:
            return await echo(conn)
        accepted = 0
        while accepted < 10_000:  # bound: kernel buffers hold a few MB at most
            ok = conn.send_nowait(BIG)
            if not ok:
                break
            accepted += 1
            await trio.testing.wait_all_tasks_blocked()  # let the writer fill the socket
        result.update(ok=ok, accepted=accepted, closed=conn.closed, reason=conn.close_reason,
                      again=conn.send_nowait(BIG))
        done.set()

    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, handler, counters, max_queue=8)
        with trio.fail_after(30):
            async with await connect(SERVER, port, reg(GOOD_IP), local_ip=GOOD_IP, counters=Counters()) as good:
                staller = await trio.open_tcp_stream(SERVER, port, local_address=BAD_IP)
                await staller.send_all(encode(reg(BAD_IP)))  # ... and never reads
                await done.wait()
                await round_trip(good, frame())
                await staller.aclose()
        nursery.cancel_scope.cancel()

    assert result["ok"] is False and result["again"] is False
    assert result["closed"] and result["reason"] == "send-overflow"
    assert result["accepted"] >= 8  # at least the queue was filled
    assert counters.get("send_overflow") == 1
    assert len(lines(caplog, "is full")) == 1


async def test_send_times_out_on_a_peer_that_never_reads(autojump_clock):
    counters = Counters()
    result: dict = {}

    async def handler(conn):
        started = trio.current_time()
        sent = 0
        try:
            while sent < 10_000:
                await conn.send(BIG)
                sent += 1
        except ConnectionClosed:
            result.update(elapsed=trio.current_time() - started, closed=conn.closed)
        result["sent"] = sent

    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, handler, counters, max_queue=4, send_timeout=10.0)
        with trio.fail_after(120):
            staller = await trio.open_tcp_stream(SERVER, port, local_address=BAD_IP)
            await staller.send_all(encode(reg(BAD_IP)))
            while "sent" not in result:
                await trio.sleep(1)
            await staller.aclose()
        nursery.cancel_scope.cancel()
    assert result["closed"] and 10.0 <= result["elapsed"] < 60
    assert result["sent"] >= 4
    assert counters.get("send_timeout") == 1


# --- connect_forever -------------------------------------------------------------------------


async def test_connect_forever_reconnects_after_the_server_closes(autojump_clock):
    server_counters, client_counters = Counters(), Counters()
    sessions: list[str] = []
    second = trio.Event()

    async def handler(conn):
        sessions.append("server")
        if sessions.count("server") == 1:
            conn.send_nowait(encode(Status(False, {"bye": True})))
            return  # server ends the first connection
        await echo(conn)

    async def on_connected(conn):
        sessions.append("client")
        if sessions.count("client") == 1:
            assert await conn.receive() == Status(False, {"bye": True})
            await conn.receive()  # raises ConnectionClosed: the server hung up
            raise AssertionError("not reached")
        await round_trip(conn, frame())
        second.set()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, handler, server_counters)
        nursery.start_soon(partial(connect_forever, SERVER, port, reg(GOOD_IP), on_connected,
                                   local_ip=GOOD_IP, counters=client_counters))
        with trio.fail_after(60):
            await second.wait()
        nursery.cancel_scope.cancel()
    assert sessions == ["server", "client", "server", "client"]
    assert client_counters.get("connected") == 2
    assert server_counters.get("connections_accepted") == 2
    assert client_counters.get("connect_failed") == 0
    assert client_counters.get("session_error") == 0


async def test_connect_forever_waits_for_a_late_server(caplog, autojump_clock):
    caplog.set_level(logging.INFO, logger=T)
    host, client_ip = "127.0.0.23", "127.0.0.24"
    port = free_port(host)
    client_counters = Counters()
    connected = trio.Event()

    async def on_connected(conn):
        await round_trip(conn, frame(client_ip))
        connected.set()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(connect_forever, host, port, reg(client_ip), on_connected, local_ip=client_ip,
                                   counters=client_counters, backoff=Backoff(first=0.1, cap=2.0, jitter=0.5),
                                   log_interval=5.0))
        await trio.sleep(12)  # virtual: the client keeps trying meanwhile
        failures = client_counters.get("connect_failed")
        reports = lines(caplog, "cannot connect")
        assert not connected.is_set()
        assert failures >= 6  # 0.1, 0.2, 0.4, ... then every ~1-2 s
        assert 2 <= len(reports) <= 3 < failures  # rate-limited: one line per 5 s at most
        await start_server(nursery, echo, Counters(), host=host, port=port)
        with trio.fail_after(10):
            await connected.wait()
        nursery.cancel_scope.cancel()
    assert client_counters.get("connected") == 1


async def test_connect_forever_survives_a_failing_session(caplog, autojump_clock):
    caplog.set_level(logging.INFO, logger=T)
    counters = Counters()
    calls = []
    again = trio.Event()

    async def on_connected(conn):
        calls.append(conn)
        if len(calls) == 1:
            raise ValueError("bug in a session")
        again.set()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, echo, Counters())
        nursery.start_soon(partial(connect_forever, SERVER, port, reg(GOOD_IP), on_connected,
                                   local_ip=GOOD_IP, counters=counters))
        with trio.fail_after(60):
            await again.wait()
        nursery.cancel_scope.cancel()
    assert counters.get("session_error") == 1 and calls[0].closed
    assert any(r.exc_info and "bug in a session" in str(r.exc_info[1]) for r in caplog.records)


async def _mute_server(accepted: list) -> tuple[int, list]:
    """A TCP server that accepts and then never reads or sends a byte (a stopped process
    whose kernel still holds its sockets). Returns the port; connections go to ``accepted``."""
    (listener,) = await trio.open_tcp_listeners(0, host=SERVER)

    async def accept_forever() -> None:
        async with listener:
            while True:
                accepted.append((trio.current_time(), await listener.accept()))

    return listener.socket.getsockname()[1], accept_forever


async def test_connect_forever_gives_a_silent_server_up_within_the_timeout_and_dials_again(caplog, autojump_clock):
    caplog.set_level(logging.INFO, logger=T)
    counters = Counters()
    accepted: list = []
    ended: list[tuple[float, str]] = []
    port, accept_forever = await _mute_server(accepted)

    async def on_connected(conn):
        try:
            await conn.receive()
        finally:
            ended.append((trio.current_time(), conn.close_reason))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept_forever)
        nursery.start_soon(partial(connect_forever, SERVER, port, reg(GOOD_IP), on_connected, local_ip=GOOD_IP,
                                   counters=counters, silence_timeout=5.0))
        with trio.fail_after(60):
            while len(accepted) < 2:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    (first_at, _), (second_at, _) = accepted[:2]
    assert ended[0][1] == "silent"
    assert 5.0 <= ended[0][0] - first_at <= 5.1  # given up at the timeout, not later
    assert second_at - ended[0][0] <= 0.2  # and dialled again at once (back-off 0.1)
    assert counters.get("heartbeat_missed") == 1 and counters.get("connected") == 2
    (line,) = lines(caplog, "sent nothing")
    assert f"{SERVER}:{port} sent nothing for 5.0 s" in line and "dialling again" in line
    for _, stream in accepted:
        await stream.aclose()


async def test_a_server_that_heartbeats_or_a_busy_reader_is_never_given_up(autojump_clock):
    """Silence is time spent listening for a peer that sends nothing: heartbeats reset it,
    and a session that is busy (not in receive) does not count its peer as silent."""
    counters = Counters()
    received = []

    async def heartbeats(conn):
        while True:
            conn.send_urgent(encode(Heartbeat(SERVER, trio.current_time())))
            await trio.sleep(1.0)

    async def on_connected(conn):
        while True:
            received.append(await conn.receive())
            if len(received) == 3:
                await trio.sleep(30)  # busy for six timeouts: its backlog is not the server's silence

    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, heartbeats, Counters(), verify_source=False)
        nursery.start_soon(partial(connect_forever, SERVER, port, reg(GOOD_IP), on_connected, local_ip=GOOD_IP,
                                   counters=counters, silence_timeout=5.0))
        await trio.sleep(60)
        nursery.cancel_scope.cancel()
    assert counters.get("heartbeat_missed") == 0 and counters.get("connected") == 1
    assert len(received) > 20


async def test_connect_failure_is_an_oserror():
    port = free_port(SERVER)  # nothing listens there
    with trio.fail_after(10), pytest.raises(OSError):
        await connect(SERVER, port, reg(GOOD_IP), local_ip=GOOD_IP, counters=Counters())


# --- metrics --------------------------------------------------------------------------------

def test_counters_snapshot_and_prometheus_text():
    c = reference_counters()
    assert c.get("frames_received", kind="frame", flag="1") == 5
    assert c.get("frames_received", kind="ack") == 0
    assert c.total("frames_received") == 6
    snap = c.snapshot()
    assert snap['frames_received{kind="frame",flag="1"}'] == 5
    assert snap['frames_received{kind="register"}'] == 1
    assert snap["sent_bytes"] == 1234
    assert c.gauges() == {'connections_open{role="host"}': 3, "load": 0.25}
    assert parse_prometheus(render_prometheus(c)) == REFERENCE
    assert "x_frames_received_total" in parse_prometheus(render_prometheus(c, prefix="x_"))
    text = render_prometheus(c)
    assert f"# HELP dedupnet_sent_bytes_total {METRICS['sent_bytes'].help}\n# TYPE dedupnet_sent_bytes_total counter\n" in text
    assert "# HELP dedupnet_load not declared in dedupnet/adapters/monitor/metric_catalog.py\n" in text
    assert render_prometheus(Counters()) == ""
    with pytest.raises(ValueError):
        c.inc("bad name")
    with pytest.raises(ValueError):
        c.inc("ok", **{"bad-label": "x"})
    with pytest.raises(ValueError):
        c.inc("ok", -1)


@pytest.mark.parametrize("text", ["x_total 1\n", "# TYPE x_total counter\nx_total 1\n",
                                  "# HELP x_total x\n# TYPE x_total counter\nx_total{a=1} 1\n",
                                  "# HELP x_total x\n# TYPE x_total counter\nx_total 1"])
def test_the_reader_refuses_what_a_scraper_would(text):
    with pytest.raises(ValueError):
        parse_prometheus(text)


async def http(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    with trio.fail_after(30):
        async with await trio.open_tcp_stream(SERVER, port) as stream:
            if request:
                await stream.send_all(request)
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("ascii").split("\r\n")
    assert status_line.startswith("HTTP/1.1 ")
    headers = {k.lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines)}
    assert int(headers["content-length"]) == len(body)
    return int(status_line.split()[1]), headers, body


async def test_serve_metrics_over_tcp():
    c = reference_counters()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_metrics, c, SERVER, 0)
        status, headers, body = await http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n")
        assert status == 200 and headers["content-type"] == CONTENT_TYPE
        assert body.decode() == render_prometheus(c)
        parse_prometheus(body.decode())
        c.inc("sent_bytes", 1)  # each scrape sees the current values
        status, _, body = await http(port, b"GET /metrics?x=1 HTTP/1.0\r\n\r\n")
        assert status == 200 and b"dedupnet_sent_bytes_total 1235\n" in body
        for request in (b"GET / HTTP/1.1\r\n\r\n", b"GET /other HTTP/1.1\r\n\r\n", b"POST /metrics HTTP/1.1\r\n\r\n"):
            assert (await http(port, request))[0] == 404
        assert (await http(port, b"nonsense\r\n\r\n"))[0] == 400
        assert (await http(port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n"))[0] == 431
        nursery.cancel_scope.cancel()


async def test_serve_metrics_closes_a_silent_client(autojump_clock):
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_metrics, Counters(), SERVER, 0)
        started = trio.current_time()
        status, _, _ = await http(port, b"GET /metr")  # never finishes the head
        assert status == 408 and trio.current_time() - started >= 5.0
        nursery.cancel_scope.cancel()


async def test_a_heartbeat_goes_only_on_a_quiet_link_and_now_and_then_on_a_busy_one(autojump_clock):
    """Any message is a heartbeat at the receiver: a link that carried one within half an
    interval needs none, but every ``BEAT_EVERY`` intervals one goes all the same (it
    carries what only a heartbeat says: a store watermark, a host's task count)."""
    from dedupnet.adapters.runtime import BEAT_EVERY, beat, heartbeat

    a, b = socket.socketpair()  # what is written waits unread in b
    ours = trio.SocketStream(trio.socket.from_stdlib_socket(a))
    interval, beats = 1.0, []
    async with Connection(ours, counters=Counters()) as conn:
        for tick in range(3 * BEAT_EVERY):
            conn.send_nowait(heartbeat("127.0.1.10"))  # busy: a message every interval...
            await trio.sleep(interval / 4)  # ...written a quarter interval before the tick
            if beat(conn, heartbeat("127.0.1.10"), interval):  # tick 0: a new link hears one at once
                beats.append(tick)
            await trio.sleep(interval * 3 / 4)
        assert beats == [0, BEAT_EVERY, 2 * BEAT_EVERY]
        await trio.sleep(interval / 2)  # quiet for half an interval: due again, however fresh our last beat
        conn.last_beat = trio.current_time()
        assert beat(conn, heartbeat("127.0.1.10"), interval)
    b.close()


async def test_the_store_watermark_rides_on_a_links_first_heartbeat_and_every_tenth(autojump_clock):
    """On a quiet link the watermark was half of each heartbeat's bytes: the lean form goes
    in between, and the receiver hears the watermark as often as a busy link's does."""
    from dedupnet.adapters.runtime import BEAT_EVERY, beat, heartbeat
    from dedupnet.codec.wire import Decoder

    a, b = socket.socketpair()
    ours = trio.SocketStream(trio.socket.from_stdlib_socket(a))
    full, lean = heartbeat("127.0.1.10", store=("a1b2c3d4e5f60718", 7)), heartbeat("127.0.1.10")
    async with Connection(ours, counters=Counters()) as conn:
        for _ in range(2 * BEAT_EVERY + 1):
            assert beat(conn, full, 1.0, lean)  # quiet: one each interval
            await trio.sleep(1.0)
    decoder = Decoder()
    b.setblocking(False)
    decoder.feed(b.recv(1 << 20))
    stores = [m.store for m in decoder.events()]
    b.close()
    assert len(stores) == 2 * BEAT_EVERY + 1
    assert [i for i, s in enumerate(stores) if s is not None] == [0, BEAT_EVERY, 2 * BEAT_EVERY]
    assert len(lean) < len(full) * 0.6
