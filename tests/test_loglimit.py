"""Logs an attacker cannot flood: what a server writes about its connections is under a
budget per source address (dedupnet/adapters/net/ratelimit.py); the rest is counted as
``log_suppressed``, on /metrics with the other counters. Real TCP on loopback; time on
a MockClock that stands still unless the test moves it."""

from __future__ import annotations

import logging
import socket
import struct
from functools import partial

import trio

from dedupnet.adapters.monitor.metrics import Counters, render_prometheus
from dedupnet.adapters.net.ratelimit import LogLimiter
from dedupnet.adapters.net.transport import Connection, serve

SERVER = "127.0.0.1"
ATTACKER = "127.0.0.9"
ABORTS = 2000


async def abort_connection(port: int) -> None:
    """Connect from ATTACKER and reset at once (SO_LINGER 0: an RST, no FIN)."""
    sock = trio.socket.socket()
    try:
        await sock.bind((ATTACKER, 0))
        await sock.connect((SERVER, port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()


def connection_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("dedupnet") and not r.getMessage().startswith("listening on")]


async def never_called(conn: Connection) -> None:
    raise AssertionError("no aborted connection registers")


async def test_two_thousand_aborted_connections_write_a_bounded_number_of_lines(mock_clock, caplog):
    caplog.set_level(logging.INFO)
    counters = Counters()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(partial(serve, counters=counters, max_connections_per_source=None),
                                   SERVER, 0, never_called)
        for _ in range(ABORTS):
            await abort_connection(port)
        handled = lambda: counters.total("handshake_failed")  # noqa: E731 - one per aborted connection
        for _ in range(1_000_000):  # the clock stands still: wait by checkpoints, bounded
            if handled() >= ABORTS:
                break
            await trio.sleep(0)
        assert handled() == ABORTS, counters.snapshot()

        lines = connection_lines(caplog)
        # One budget for the source; a connection reset before it was accepted has no
        # source address left to read and is budgeted as an unknown one.
        assert 1 <= len(lines) <= 20, lines[:30]
        assert len(lines) + counters.get("log_suppressed") == ABORTS
        assert "dedupnet_log_suppressed_total " in render_prometheus(counters)

        # Later, the source's next line is written and says how many were not.
        mock_clock.jump(600)
        caplog.clear()
        await abort_connection(port)
        while handled() < ABORTS + 1:
            await trio.sleep(0)
        (line,) = connection_lines(caplog)
        assert "earlier lines about" in line and "not logged: over its log budget" in line
        nursery.cancel_scope.cancel()


def test_the_budget_is_per_source_and_for_all_sources_together(caplog):
    caplog.set_level(logging.INFO)
    now = [0.0]
    counters = Counters()
    limiter = LogLimiter(counters, burst=3, rate=1.0, total_burst=5, total_rate=10.0, max_sources=2,
                         clock=lambda: now[0])
    logger = logging.getLogger("dedupnet.test")
    written = [limiter.log(logger, logging.INFO, "10.0.0.1", "line %d", i) for i in range(10)]
    assert written == [True] * 3 + [False] * 7
    assert limiter.log(logger, logging.INFO, "10.0.0.2", "other") is True  # another source has its own
    assert [limiter.log(logger, logging.INFO, f"10.0.1.{i}", "many") for i in range(4)] == [True, False, False, False]
    assert counters.get("log_suppressed") == 10  # 7 + the 3 over the total budget
    now[0] = 10.0
    assert limiter.log(logger, logging.INFO, "10.0.0.1", "back") is True  # refilled (and forgotten: max_sources=2)
    assert len(limiter._sources) == 2  # the table stays bounded
    now[0] = 20.0
    limiter.log(logger, logging.INFO, "10.0.1.3", "again")
    assert caplog.records[-1].getMessage() == "again (1 earlier lines about 10.0.1.3 not logged: over its log budget)"
