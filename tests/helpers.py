"""What many test files need, written once: waiting for a condition (on trio's clock, or in
real time beside daemons in other processes), the ``dedupnet`` command, a free port, and
a protocol server that echoes, with the Register of its clients, and raw bytes sent to a
server; the Scrapy tests' hosts, and the check of a simulation report's CPU figures."""

from __future__ import annotations

import inspect
import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import trio

from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.net.transport import Connection, serve
from dedupnet.codec.messages import Register
from dedupnet.codec.wire import Decoder, encode
from dedupnet.harness.report import format_report

#: The command line of ``dedupnet``, as an operator runs it, in this interpreter.
DEDUPNET = [sys.executable, "-m", "dedupnet.cli"]

#: The Scrapy hosts of the Scrapy tests (``dedupnet local --no-crawl`` beside a spider):
#: the first host of networks 1 and 2.
SCRAPY_HOSTS = ("127.0.1.10", "127.0.2.10")


async def until(predicate: Callable[[], Any], timeout: float = 20.0, *, poll: float = 0.01, what: str = "") -> Any:
    """Wait for ``predicate()`` (a value, or an awaitable of one) to be true, asking every
    ``poll`` seconds of trio's clock (virtual under a MockClock); its value. The test
    fails after ``timeout`` seconds: the bound only matters when the test fails."""
    with trio.move_on_after(timeout):
        while True:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            await trio.sleep(poll)
    raise AssertionError(f"not within {timeout:g} s: {what or getattr(predicate, '__name__', predicate)}")


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, *, poll: float = 0.1) -> Any:
    """The same in real time, outside trio (daemons in other processes): ``predicate()``'s
    first true value, or its last value when ``timeout`` seconds have passed (the caller
    asserts, with what it knows of the failure)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(poll)
    return predicate()


def dedupnet(*args: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    """Run ``dedupnet ARGS`` and wait for it; its output captured as text."""
    return subprocess.run([*DEDUPNET, *args], capture_output=True, text=True, timeout=timeout, **kw)


def status(address: str) -> dict | None:
    """``dedupnet status ADDRESS --json``, or None while the daemon does not answer."""
    out = dedupnet("status", address, "--json")
    return json.loads(out.stdout) if out.returncode == 0 else None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at ``host`` (at the time of asking)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def reg(ip: str, role: str = "host", *, compress: tuple[str, ...] | None = None) -> Register:
    """The Register of a party at ``ip`` on loopback's LAN."""
    return Register(ip, 1, role, f"{ip}:7001", "127.0.0.0/8", compress)


async def echo(conn: Connection) -> None:
    """A session handler that sends back every message it receives."""
    while True:
        msg = await conn.receive()
        await conn.send(encode(msg))


async def start_server(nursery: trio.Nursery, handler, counters: Counters, host: str = "127.0.0.1", port: int = 0,
                       **options) -> int:
    """A protocol server on ``host`` running ``handler`` for each session; its port."""
    return await nursery.start(partial(serve, counters=counters, **options), host, port, handler)


async def raw_exchange(port: int, data: bytes, local_ip: str, host: str = "127.0.0.1") -> list:
    """Raw bytes sent from ``local_ip`` (none: only listen); every message received until
    the server closes, which must be at a message's end."""
    with trio.fail_after(30):
        stream = await trio.open_tcp_stream(host, port, local_address=local_ip)
        async with stream:
            if data:
                await stream.send_all(data)
            decoder = Decoder()
            received = []
            while chunk := await stream.receive_some(65536):
                decoder.feed(chunk)
                received.extend(decoder)
            decoder.eof()
            return received


def check_cpu_figures(report, roles: set[str]) -> None:
    """Plausible figures: every role has a positive one, the roles add up to the total,
    per page is the total over the requests the web answered, and the text shows them."""
    assert set(report.cpu_s) == roles
    assert all(s > 0 for s in report.cpu_s.values()), report.cpu_s
    assert report.cpu_total_s == pytest.approx(sum(report.cpu_s.values()), abs=0.005)
    assert report.cpu_total_ms_per_page == pytest.approx(report.cpu_total_s * 1000 / report.requests, rel=0.01)
    assert sum(report.cpu_ms_per_page.values()) == pytest.approx(report.cpu_total_ms_per_page, rel=0.01)
    text = format_report(report)
    assert "CPU per page" in text and all(f"{role} " in text for role in roles)
