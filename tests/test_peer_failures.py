"""A failure caused by one peer's message ends that peer's connection, never the daemon.

The daemons hand each message to their reactor, which runs in a task of its own; an
exception raised there while handling a message is handed back to the connection it
came on (``Connection.fail``) and raised from that connection's receive, so the
handler's catch-all logs it, counts it and closes that connection only. Here the cores
are made to raise on one marked message (a bug stands in for any input the code does
not expect); real daemons, TCP and Redis otherwise.
"""

from __future__ import annotations

import trio

from center_host.daemon import CenterDaemon, CenterSettings
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.runtime import Reactor
from dedupnet.adapters.storage.store import Store
from dedupnet.adapters.net.transport import ConnectionClosed, connect, serve
from dedupnet.codec import wire
from dedupnet.codec.messages import Ack, Frame, Heartbeat, Register, Task
from dedupnet.codec.numbers import make_number
from local_host.daemon import LocalDaemon, LocalSettings

from .helpers import until

CENTER, LAN = "127.0.5.1", "127.0.5.0/24"
BAD_NUMBER = make_number(5, 66, 1)


def raising_on(reactor, marked):
    """The reactor's core raises on the marked event (a stand-in for any bug)."""
    handle = reactor._handle

    def patched(event):
        if marked(event):
            raise RuntimeError("a bug the message found")
        return handle(event)
    reactor._handle = patched


async def host_conn(port, ip, nursery, received):
    conn = await connect(CENTER, port, Register(ip, 5, "host", f"{ip}:1", LAN), local_ip=ip, counters=Counters())

    async def run(task_status=trio.TASK_STATUS_IGNORED):
        async with conn:
            task_status.started()
            try:
                while True:
                    msg = await conn.receive()
                    if not isinstance(msg, Heartbeat):
                        received.append(msg)
            except ConnectionClosed:
                received.append("closed")
    await nursery.start(run)
    return conn


async def test_a_message_that_makes_the_center_raise_closes_only_its_connection(redis_url, prefix):
    store = Store(redis_url, prefix)
    center = CenterDaemon(CenterSettings(5, CENTER, 0, LAN), store)
    raising_on(center.reactor, lambda e: getattr(getattr(e, "message", None), "number", None) == BAD_NUMBER)
    try:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(center.run)
            bad_got, good_got = [], []
            bad = await host_conn(port, "127.0.5.66", nursery, bad_got)
            good = await host_conn(port, "127.0.5.10", nursery, good_got)
            bad.send_nowait(wire.encode(Frame({"http://a.example/": 0}, "127.0.5.66", BAD_NUMBER, 1)))
            await until(lambda: "closed" in bad_got)
            assert center.counters.get("handler_error") == 1
            # The center goes on: the other host's set is stored and acknowledged.
            number = make_number(5, 10, 1)
            good.send_nowait(wire.encode(Frame({"http://b.example/": 0}, "127.0.5.10", number, 1)))
            await until(lambda: Ack(number, "stored") in good_got)
            assert "closed" not in good_got
            nursery.cancel_scope.cancel()
    finally:
        store.delete_prefix()
        store.close()


async def test_a_message_that_makes_the_host_raise_ends_the_session_and_it_reconnects(redis_url, prefix):
    sessions = []

    async def center(conn):
        sessions.append(conn)
        if len(sessions) == 1:
            conn.send_nowait(wire.encode(Ack(BAD_NUMBER, "stored")))
        await trio.sleep_forever()

    store = Store(redis_url, prefix)
    host = LocalDaemon(LocalSettings(5, "127.0.5.10", LAN, (CENTER, 0)), store)
    raising_on(host.reactor, lambda e: getattr(getattr(e, "message", None), "number", None) == BAD_NUMBER)
    try:
        async with trio.open_nursery() as nursery:
            from functools import partial
            port = await nursery.start(partial(serve, counters=Counters(), accept_roles=("host",)), CENTER, 0, center)
            host.settings.center = (CENTER, port)
            await nursery.start(host.run)
            await until(lambda: len(sessions) >= 2)
            assert host.counters.get("session_error") == 1
            nursery.cancel_scope.cancel()
    finally:
        store.delete_prefix()
        store.close()


async def test_a_full_inbox_does_not_drop_or_raise_on_post():
    """Timers and a connection's end post without waiting; an inbox kept full by
    busy connections must not raise there (a timer task that raises ends the daemon)
    nor lose the event."""
    handled = []
    gate = trio.Event()

    async def execute(actions):
        await gate.wait()
        return []

    reactor = Reactor(lambda e: handled.append(e) or [], execute, inbox=2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reactor.run)
        await reactor.put("a")
        await trio.sleep(0.01)  # "a" is being handled; the inbox fills
        await reactor.put("b")
        await reactor.put("c")
        reactor.post("left")  # full: no WouldBlock
        gate.set()
        await until(lambda: len(handled) == 4)
        nursery.cancel_scope.cancel()
    assert handled == ["a", "b", "c", "left"]


async def test_a_handed_back_task_is_normalised_where_it_enters(redis_url, prefix):
    """A leaving host's tasks are checked like any set: a URL no pool may hold is
    dropped and counted; before, it ended the center (ValueError in task assignment)."""
    store = Store(redis_url, prefix)
    center = CenterDaemon(CenterSettings(5, CENTER, 0, LAN), store)
    try:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(center.run)
            leaving_got, staying_got = [], []
            leaving = await host_conn(port, "127.0.5.66", nursery, leaving_got)
            await host_conn(port, "127.0.5.10", nursery, staying_got)
            await until(lambda: len(center.core.members.hosts) == 2)
            leaving.send_nowait(wire.encode(Task(BAD_NUMBER, ("javascript:alert(1)", "HTTP://A.Example:80/x#f"))))
            await until(lambda: Ack(BAD_NUMBER, "stored") in leaving_got)
            await until(lambda: any(isinstance(m, Task) for m in staying_got))
            (task,) = [m for m in staying_got if isinstance(m, Task)]
            assert task.URLs == ("http://a.example/x",)
            assert center.counters.get("bad_input", reason="bad-url") == 1
            assert center.counters.get("handler_error") == 0
            nursery.cancel_scope.cancel()
    finally:
        store.delete_prefix()
        store.close()


async def test_a_center_cannot_exhaust_a_hosts_numbers(redis_url, prefix):
    """A 'number-reused' refusal names the sequence to number from; one at the top of
    the sequence space would leave the host no number for its next set (make_number
    raised in the walker's event, which ended the host daemon). Such a refusal is
    logged and the set kept, as any other refusal."""
    frames = []

    async def center(conn):
        while True:
            msg = await conn.receive()
            if isinstance(msg, Frame) and msg.flag == 1:
                frames.append(msg)
                if len(frames) == 1:
                    conn.send_nowait(wire.encode(Ack(msg.number, "rejected", "number-reused", 2**31 - 1)))
                else:
                    conn.send_nowait(wire.encode(Ack(msg.number, "stored")))

    store = Store(redis_url, prefix)
    host = LocalDaemon(LocalSettings(5, "127.0.5.10", LAN, (CENTER, 0), set_size=5), store)
    try:
        async with trio.open_nursery() as nursery:
            from functools import partial
            port = await nursery.start(partial(serve, counters=Counters(), accept_roles=("host",)), CENTER, 0, center)
            host.settings.center = (CENTER, port)
            await nursery.start(host.run)
            await trio.to_thread.run_sync(host.pools.push, [f"http://a.example/{i}" for i in range(5)])
            await until(lambda: len(frames) >= 1)
            await trio.sleep(0.2)
            await trio.to_thread.run_sync(host.pools.push, [f"http://b.example/{i}" for i in range(5)])
            await until(lambda: any("http://b.example/0" in f.URL_set for f in frames))
            nursery.cancel_scope.cancel()
    finally:
        store.delete_prefix()
        store.close()
