"""Limits against abuse: a slowloris is cut at the handshake deadline,
one source cannot hold more than ``max_connections_per_source`` connections, a
connection over its byte or message rate is throttled (nothing lost), and under a flood
from one source a legitimate crawl still completes. Real TCP on loopback; timing on
trio's MockClock (``autojump_clock``)."""

from __future__ import annotations

import random

import pytest
import trio

from dedupnet.codec.messages import Frame, Heartbeat
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.harness.report import SimConfig
from dedupnet.harness.sim import simulate
from dedupnet.adapters.net.transport import Connection, TokenBucket, connect
from dedupnet.codec.wire import Decoder, encode

from .helpers import echo, reg, start_server

SERVER = "127.0.0.1"
GOOD_IP = "127.0.0.5"
BAD_IP = "127.0.0.9"


def test_token_bucket():
    b = TokenBucket(10.0, 5.0, now=0.0)
    b.take(5, 0.0)
    assert b.wait(0.0) == 0.0
    b.take(3, 0.0)  # 3 in debt: 0.3 s to pay back
    assert b.wait(0.0) == pytest.approx(0.3)
    assert b.wait(0.3) == 0.0
    assert b.wait(100.0) == 0.0 and b.tokens == 5.0  # never more than the burst
    with pytest.raises(ValueError):
        TokenBucket(0, 1, now=0.0)


async def test_slowloris_is_cut_at_the_handshake_deadline(autojump_clock):
    """A Register trickled one byte a second never completes: the deadline runs from the
    connection, not from the last byte."""
    counters = Counters()
    data = encode(reg(BAD_IP))
    sent = 0
    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, echo, counters, handshake_timeout=5.0)
        with trio.fail_after(120):
            stream = await trio.open_tcp_stream(SERVER, port, local_address=BAD_IP)
            started = trio.current_time()
            decoder = Decoder()
            replies = []

            async def read() -> None:
                while chunk := await stream.receive_some(65536):
                    decoder.feed(chunk)
                    replies.extend(decoder)

            async with trio.open_nursery() as inner:
                inner.start_soon(read)
                try:
                    for i in range(len(data)):
                        await stream.send_all(data[i : i + 1])
                        sent += 1
                        await trio.sleep(1.0)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
            elapsed = trio.current_time() - started
            await stream.aclose()
        nursery.cancel_scope.cancel()
    assert [m.reason for m in replies] == ["timeout"]
    assert counters.get("handshake_failed", reason="timeout") == 1
    assert 5 <= sent <= 10 < len(data)  # cut after ~5 of its bytes (plus the 1 s the Error lingers)
    assert elapsed < 12


async def test_connections_per_source_are_capped(autojump_clock):
    counters = Counters()
    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, echo, counters, max_connections_per_source=3, handshake_timeout=60.0)
        with trio.fail_after(30):
            held = [await trio.open_tcp_stream(SERVER, port, local_address=BAD_IP) for _ in range(3)]
            await trio.sleep(0.1)
            refused = [await trio.open_tcp_stream(SERVER, port, local_address=BAD_IP) for _ in range(2)]
            for stream in refused:  # closed at once, without a word
                try:
                    assert await stream.receive_some(100) == b""
                except trio.BrokenResourceError:
                    pass
            # Another source is served as usual meanwhile.
            async with await connect(SERVER, port, reg(GOOD_IP), local_ip=GOOD_IP, counters=Counters()) as conn:
                await conn.send(encode(Heartbeat(GOOD_IP, 1.0)))
                assert await conn.receive() == Heartbeat(GOOD_IP, 1.0)
            assert counters.get("handshake_failed", reason="too-many") == 2
            # A slot that is freed can be taken again.
            await held.pop().aclose()
            await trio.sleep(0.1)
            async with await connect(SERVER, port, reg(BAD_IP), local_ip=BAD_IP, counters=Counters()) as conn:
                await conn.send(encode(Heartbeat(BAD_IP, 2.0)))
                assert await conn.receive() == Heartbeat(BAD_IP, 2.0)
            assert counters.get("handshake_failed", reason="too-many") == 2
            for stream in held + refused:
                await stream.aclose()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("what", ["messages", "bytes"])
async def test_a_connection_over_its_rate_is_throttled_and_loses_nothing(autojump_clock, what):
    counters = Counters()
    got: list = []
    done = trio.Event()
    n = 60

    async def handler(conn: Connection) -> None:
        while len(got) < n:
            got.append(await conn.receive())
        done.set()

    if what == "messages":
        options = dict(max_messages_per_s=10.0, burst_messages=10.0)
        msgs = [Heartbeat(GOOD_IP, float(i)) for i in range(n)]
    else:  # ~1 KiB frames at 2 KiB/s, a burst of one 4 KiB frame (the burst is at least a frame)
        options = dict(max_bytes_per_s=2048.0, burst_bytes=1.0, max_frame_size=4096)
        msgs = [Frame({f"http://site.test/{i}/{j}" + "x" * 20: 0 for j in range(25)}, GOOD_IP, i, 1) for i in range(n)]
    async with trio.open_nursery() as nursery:
        port = await start_server(nursery, handler, counters, **options)
        with trio.fail_after(600):
            async with await connect(SERVER, port, reg(GOOD_IP), local_ip=GOOD_IP, counters=Counters(),
                                     compress=False) as conn:
                started = trio.current_time()
                for msg in msgs:
                    await conn.send(encode(msg))
                await done.wait()
                elapsed = trio.current_time() - started
        nursery.cancel_scope.cancel()
    assert got == msgs  # all of it, in order: slowed down, not dropped
    assert counters.get("throttled", what=what) > 0
    assert counters.total("bad_input") == 0
    if what == "messages":
        assert elapsed >= (n - 10 - 1) / 10  # 60 messages at 10/s after a burst of 10 (the Register is one)
    else:
        total = sum(len(encode(m)) for m in msgs)
        assert elapsed >= (total - 4096 - 300) / 2048


async def test_a_crawl_completes_under_a_flood_from_one_source(redis_url):
    """From one address inside LAN 1: more connections than allowed, held open in
    silence, and a stream of garbage and of oversized headers on fresh connections, all
    crawl long. The legitimate hosts' crawl completes with nothing lost or duplicated."""
    attacker = "127.0.1.66"
    seen = {"opened": 0}

    async def flood(system, web) -> None:
        address = system.center_address(1)
        rnd = random.Random(5)
        held: list = []

        async def garbage() -> None:
            while True:
                try:
                    stream = await trio.open_tcp_stream(*address, local_address=attacker)
                except OSError:
                    await trio.sleep(0.05)
                    continue
                seen["opened"] += 1
                try:
                    with trio.move_on_after(1.0):
                        if rnd.random() < 0.5:
                            await stream.send_all(rnd.randbytes(65536))
                        else:  # a valid header claiming a 4 GiB body
                            await stream.send_all(b"DN\x01\x01\xff\xff\xff\xff" + bytes(8))
                        await stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
                await trio.aclose_forcefully(stream)
                await trio.sleep(0.01)

        try:
            for _ in range(40):  # more than max_connections_per_source (16), silent
                try:
                    held.append(await trio.open_tcp_stream(*address, local_address=attacker))
                except OSError:
                    pass
            # Keep 10 of the accepted ones silent (until the center's 5 s handshake deadline)
            # and let the garbage have the other slots at once: a crawl over in less than 5 s
            # (an idle machine) would otherwise see only refusals, never garbage.
            while len(held) > 10:
                await trio.aclose_forcefully(held.pop())
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(garbage)
        finally:
            for stream in held:
                await trio.aclose_forcefully(stream)

    cfg = SimConfig(networks=2, hosts=2, pages=300, sites=6, timeout=60, seeds=4)
    r = await simulate(cfg, redis_url, out=None, during=flood)
    assert not r.timed_out
    assert r.lost_urls == 0 and r.duplicate_fetches == 0 and r.invariant_violations == 0
    assert r.fetched_urls == r.reachable_urls
    assert r.bad_input.get('handshake_failed{reason="too-many"}', 0) > 0
    assert r.bad_input.get('bad_input{reason="bad-magic"}', 0) + r.bad_input.get('bad_input{reason="too-large"}', 0) > 0
    assert seen["opened"] > 10, r.bad_input
