"""The trio-native store driver (AsyncStore.drive/execute) against the real embedded Redis."""

import numpy as np
import pytest
import redis
import trio
from redis.exceptions import ResponseError

from dedupnet.adapters.storage import aio
from dedupnet.adapters.storage.aio import AsyncStore
from dedupnet.adapters.children import free_port
from dedupnet.adapters.storage.embedded import EmbeddedRedis
from dedupnet.codec.errors import StoreUnavailable
from dedupnet.adapters.runtime import Reactor
from dedupnet.adapters.storage.store import FINISH_URL, URL_POOL, Store
from dedupnet.codec.backoff import Backoff
from dedupnet.codec.urls import fingerprint_many
from local_host import protocol as hp
from local_host.pools import HostPools


@pytest.fixture
async def astore(store):
    a = AsyncStore(store)
    yield a
    await a.aclose()


def urls(n, tag="u"):
    return [f"http://s{i % 13}.example/{tag}/{i}" for i in range(n)]


async def test_round_trip_matches_the_sync_store(store, astore):
    fps = fingerprint_many(urls(1000))
    batch = store.batch()
    added = batch.fingerprints(b"SADD", store.key(FINISH_URL), fps[:600])
    assert added.total(await astore.execute(batch)) == 600
    batch = store.batch()
    flags = batch.fingerprints(b"SMISMEMBER", store.key(FINISH_URL), fps)
    got = flags.flags(await astore.execute(batch))
    assert np.array_equal(got, store.fp_contains(FINISH_URL, fps))
    assert got[:600].all() and not got[600:].any()
    assert await astore.execute(store.batch()) == []


async def test_replies_come_back_in_order_errors_in_place(store, astore):
    batch = store.batch()
    key = store.key("k")
    batch.add(b"SET", key, b"abc")
    for i in range(500):
        batch.add(b"APPEND", key, b"x")
        if i == 250:
            batch.add(b"INCR", key)  # an error reply, in its place; the rest goes on
    batch.add(b"GET", key)
    replies = await astore.execute(batch)
    assert replies[0] == b"OK"
    assert replies[1:252] == list(range(4, 255))
    assert isinstance(replies[252], ResponseError)
    assert replies[253:502] == list(range(255, 504))
    assert replies[-1] == b"abc" + b"x" * 500
    assert await astore.command(b"PING") == b"PONG"  # the connection is still in step


async def test_pool_operations_driven_on_trio_equal_the_sync_ones(store, astore):
    pools = HostPools(store, exact=True)
    pools.setup()
    pools.finish(urls(50))
    action = hp.Lookup(("lan", 1), tuple(urls(100)), 2)
    native = await astore.drive(pools.lookup_steps(action))
    assert native.seen == pools.lookup(action).seen == [True] * 50 + [False] * 50
    assert len(native.sequences) == 2
    pools.push(urls(30, "p"))
    taken = await astore.drive(pools.take_steps(100))
    assert [u for _, u in taken] == urls(30, "p")
    store.redis.delete(store.key(URL_POOL))  # gone under us: take starts the group again
    assert await astore.drive(pools.take_steps(100)) == []
    assert await astore.drive(pools.take_steps(100)) == []


async def test_transactions_stay_atomic_across_tasks_sharing_the_store(store):
    astore = AsyncStore(store, max_connections=3)
    key = store.key("counter")
    results = []

    def fill(batch):
        batch.add(b"INCR", key)
        batch.add(b"INCR", key)

    async def worker():
        for _ in range(25):
            results.append(await astore.drive(store.transact_steps(fill)))

    async with trio.open_nursery() as nursery:
        for _ in range(12):
            nursery.start_soon(worker)
    assert len(results) == 300
    assert all(second == first + 1 for first, second in results)  # nothing came in between
    assert sorted(first for first, _ in results) == list(range(1, 600, 2))
    await astore.aclose()


async def test_an_aborted_transaction_writes_nothing(store, astore):
    def fill(batch):
        batch.add(b"SET", store.key("a"), b"1")
        batch.add(b"SET", store.key("b"))  # wrong arity: EXECABORT, nothing applied
    with pytest.raises(ResponseError):
        await astore.drive(store.transact_steps(fill))
    assert store.redis.exists(store.key("a")) == 0
    assert await astore.command(b"PING") == b"PONG"


async def test_retried_on_a_fresh_connection_after_client_kill(store, astore):
    key = store.key("n")
    cid = await astore.command(b"CLIENT", b"ID")
    assert store.redis.client_kill_filter(_id=cid) == 1
    before = store.reconnects

    def fill(batch):
        batch.add(b"INCR", key)

    assert await astore.drive(store.transact_steps(fill)) == [1]  # applied once
    assert store.reconnects == before + 1
    assert await astore.command(b"CLIENT", b"ID") != cid
    assert int(store.redis.get(key)) == 1


async def test_every_wait_has_a_deadline_then_store_unavailable(redis_url, prefix, autojump_clock):
    store = Store(redis_url, prefix, socket_timeout=1.0, retry=Backoff(first=0.5, cap=2.0, attempts=3))
    astore = AsyncStore(store)
    start = trio.current_time()
    with pytest.raises(StoreUnavailable):
        await astore.command(b"BLPOP", store.key("never"), 0)  # blocks for good
    assert trio.current_time() - start >= 3 * 1.0 + 0.5 + 1.0
    assert store.reconnects == 2
    await astore.aclose()
    store.close()


async def test_a_cancelled_round_trip_leaves_no_connection_to_reuse(redis_url, prefix):
    """Real time (with the MockClock a real reply races virtual deadlines): cancelled
    mid-way, the connection is closed; the next call opens a fresh one."""
    store = Store(redis_url, prefix)
    astore = AsyncStore(store)
    with trio.move_on_after(0.2):
        await astore.command(b"BLPOP", store.key("never"), 0)
    assert astore._idle == []
    assert await astore.command(b"PING") == b"PONG"
    await astore.aclose()
    store.close()


async def test_unreachable_server_is_store_unavailable(autojump_clock):
    with trio.socket.socket() as s:  # a port nobody listens on
        await s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = Store(f"redis://127.0.0.1:{port}/0", "x", retry=Backoff(first=0.05, cap=2.0, attempts=3))
    with pytest.raises(StoreUnavailable):
        await AsyncStore(store).command(b"PING")
    assert store.reconnects == 2


async def test_database_number_of_the_url_is_selected(redis_url, prefix):
    base = redis_url.rsplit("/", 1)[0]
    store1 = Store(f"{base}/3", prefix)
    astore = AsyncStore(store1)
    await astore.command(b"SET", store1.key("db"), b"three")
    assert store1.redis.get(store1.key("db")) == b"three"
    assert Store(f"{base}/0", prefix).redis.get(store1.key("db")) is None
    store1.redis.delete(store1.key("db"))
    await astore.aclose()
    store1.close()


def test_unix_socket_url():
    with EmbeddedRedis(unix_socket=True) as url:
        assert url.startswith("unix://")
        store = Store(url, "unix")

        async def main():
            astore = AsyncStore(store)
            assert await astore.command(b"SET", store.key("k"), b"v") == b"OK"
            assert await astore.command(b"GET", store.key("k")) == b"v"
            await astore.aclose()

        trio.run(main)
        store.close()


def test_the_daemons_protocol_path_is_driven_natively():
    import inspect

    from center_host.pools import CenterPools

    for fn in (HostPools.apply_steps, HostPools.lookup_steps, HostPools.take_steps,
               CenterPools.apply_steps, CenterPools.lookup_steps):
        assert inspect.isgeneratorfunction(fn), fn  # so until_stored drives it on trio


async def test_until_stored_keeps_retrying_a_native_call(autojump_clock):
    from dedupnet.adapters.monitor.metrics import Counters
    from dedupnet.adapters.runtime import until_stored

    with trio.socket.socket() as s:  # a port nobody listens on
        await s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = Store(f"redis://127.0.0.1:{port}/0", "x", retry=Backoff(first=0.05, cap=2.0, attempts=2))
    counters = Counters()
    with trio.move_on_after(60) as scope:
        await until_stored(AsyncStore(store), counters, store.command_steps, b"PING")
    assert scope.cancelled_caught
    assert counters.get("store_errors") >= 5


async def _turns_taken_by_others(work) -> int:
    """How many times a bystander task got to run while ``work`` ran: each time is one
    turn of trio's run queue that ``work`` gave away."""
    turns = 0
    done = False

    async def bystander():
        nonlocal turns
        while not done:
            turns += 1
            await trio.sleep(0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(bystander)
        await trio.sleep(0)
        await work()
        done = True
    return turns


async def test_a_round_trip_to_a_nearby_redis_does_not_give_away_a_turn(store, astore, monkeypatch):
    """The reply of a local Redis is waited for in poll (SPIN), not by parking the task:
    on a busy daemon a parked task waits a whole turn of the run queue per round trip.
    SPIN is widened here so that a loaded machine, where Redis itself waits for a core,
    cannot make a reply late: what is tested is where the task waits, not how fast
    Redis answers."""
    monkeypatch.setattr(aio, "SPIN", 10.0)
    await astore.command(b"PING")  # connected

    async def pings():
        for _ in range(50):
            assert await astore.command(b"PING") == b"PONG"

    assert await _turns_taken_by_others(pings) < 10  # one per round trip before


async def test_the_reactor_handles_queued_events_back_to_back_then_yields(mock_clock):
    """Events already in the inbox are handled without a turn each (YIELD_AFTER bounds
    how long others wait); all of them, in order. On a clock that stands still, so that
    a stall of the machine cannot use up YIELD_AFTER."""
    handled = []
    reactor = Reactor(lambda e: handled.append(e) or [], _no_actions)
    for i in range(200):
        reactor.post(i)

    async def run_until_handled():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reactor.run)
            while len(handled) < 200:
                await trio.sleep(0)
            nursery.cancel_scope.cancel()

    assert await _turns_taken_by_others(run_until_handled) < 50  # about 200 before
    assert handled == list(range(200))


async def test_urgent_events_go_ahead_of_the_other_lane_each_lane_in_order(autojump_clock):
    """A center's peer messages are put urgent: those that come while the hosts' events
    fill the other lane are handled next, not after them; each lane keeps its order,
    and a reactor waiting on an empty inbox wakes for either lane."""
    handled: list = []
    gate = trio.Event()

    async def execute(actions):
        if actions == [("host", 0)]:
            await gate.wait()  # busy with the first host event while the rest queue
        return []

    reactor = Reactor(lambda e: handled.append(e) or [e], execute)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reactor.run)
        for i in range(100):
            await reactor.put(("host", i))
        await trio.sleep(1)
        assert handled == [("host", 0)]
        await reactor.put(("peer", 0), urgent=True)
        reactor.post(("peer", 1), urgent=True)
        gate.set()
        await trio.sleep(1)
        assert reactor.idle
        reactor.post(("peer", 2), urgent=True)  # the reactor is parked on an empty inbox
        await trio.sleep(1)
        await reactor.put(("host", 100))
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert handled == [("host", 0), ("peer", 0), ("peer", 1), *[("host", i) for i in range(1, 100)],
                       ("peer", 2), ("host", 100)]


async def test_a_waiter_on_changes_wakes_when_its_condition_holds_not_before(autojump_clock):
    """What a leaving host waits with instead of polling: each notify wakes it to check
    again; it returns once the condition holds, and a deadline still bounds it."""
    from dedupnet.adapters.runtime import Changes

    changes, state, checks = Changes(), {"n": 3}, []

    def done():
        checks.append(state["n"])
        return state["n"] == 0

    async with trio.open_nursery() as nursery:
        async def waiter():
            await changes.until(done)
            state["woke_at"] = trio.current_time()
        nursery.start_soon(waiter)
        for _ in range(3):
            await trio.sleep(10)
            state["n"] -= 1
            changes.notify()
    assert checks == [3, 2, 1, 0] and state["woke_at"] == 30
    with trio.move_on_after(5) as scope:
        await changes.until(lambda: False)
    assert scope.cancelled_caught


async def _no_actions(actions):
    return []


async def test_a_round_trip_on_a_descriptor_past_fd_setsize(store):
    """A process with dozens of daemons holds more than 1,024 descriptors; the wait for
    a reply must not use select() (ValueError past FD_SETSIZE: 8x4 crashed so)."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below 1,200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    filler = [os.open(os.devnull, os.O_RDONLY)]
    fps = fingerprint_many(urls(500))
    try:
        # Every descriptor below 1,100 taken, so the store's connection gets one above.
        # A descriptor another thread of the session closes meanwhile leaves a hole:
        # then fill again and connect again.
        for _ in range(5):
            while filler[-1] < 1100:
                filler.append(os.dup(filler[0]))
            astore = AsyncStore(store)
            try:
                for _ in range(20):  # some replies come after the first recv: the wait path
                    batch = store.batch()
                    batch.fingerprints(b"SADD", store.key(FINISH_URL), fps)
                    flags = batch.fingerprints(b"SMISMEMBER", store.key(FINISH_URL), fps)
                    assert flags.flags(await astore.execute(batch)).all()
                fd = astore._idle[0].sock.fileno() if astore._idle else -1
            finally:
                await astore.aclose()
            if fd > 1024:
                break
            filler.append(os.dup(filler[0]))
        assert fd > 1024
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_restarted_server_still_loading_is_waited_for_not_read_as_data(tmp_path, prefix):
    """A server restarted on its AOF answers ``-LOADING`` to every command until it has
    read it back (a `kill-redis` chaos run met it: a host's look-up read the error reply
    as flags and the daemon exited). The native driver must wait and send again, as the
    synchronous store does (store.raise_if_refused). Real time: a real server loading
    2,000 keys at 1 ms each, answering clients every 1 KiB it reads."""
    server = EmbeddedRedis(persistent=True, data_dir=tmp_path, port=free_port("127.0.0.1"), config={
        "key-load-delay": "1000", "loading-process-events-interval-bytes": "1024"})
    url = server.start()
    store = Store(url, prefix, retry=Backoff(first=0.05, cap=0.2, attempts=60))
    astore = AsyncStore(store)
    try:
        fps = fingerprint_many(urls(100))
        store.fp_add(FINISH_URL, fps)
        for i in range(0, 2000, 500):
            store.redis.mset({f"{prefix}:filler:{j}": j for j in range(i, i + 500)})
        store.redis.bgrewriteaof()  # the keys in the AOF's base, which the server loads key by key
        while int(store.redis.info("persistence")["aof_rewrite_in_progress"]):
            await trio.sleep(0.05)
        server.stop()
        restarted = trio.Event()

        async def restart():
            await trio.to_thread.run_sync(server.start)  # returns once PING is answered: loaded
            restarted.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(restart)
            loading = 0
            with trio.fail_after(30):
                while loading == 0 and not restarted.is_set():  # until a client has been told LOADING
                    await trio.sleep(0.02)
                    probe = redis.Redis.from_url(url, socket_timeout=1)
                    try:
                        probe.ping()
                    except redis.BusyLoadingError:
                        loading += 1
                    except redis.ConnectionError:
                        pass  # not listening yet
                    finally:
                        probe.close()
                assert not restarted.is_set(), "the server loaded before it could be asked"
                retries = store.reconnects
                batch = store.batch()
                flags = batch.fingerprints(b"SMISMEMBER", store.key(FINISH_URL), fps)
                got = flags.flags(await astore.execute(batch))
            assert store.reconnects > retries  # told LOADING (or refused), waited, sent again
            assert got.all()  # ...and answered from the data once loaded
    finally:
        await astore.aclose()
        store.close()
        server.stop()


async def test_an_error_reply_to_a_fingerprint_command_is_waited_out_not_read_as_data(store, astore, caplog):
    """``-OOM`` (past ``maxmemory``; ``-MISCONF`` when the server cannot persist is the
    same case) answers a write with an error, not a count: raised as the Redis error it
    is, so the daemons' ``until_stored`` logs it, counts it and tries again until
    Redis accepts the write, instead of the daemon exiting on a TypeError."""
    from dedupnet.adapters.monitor.metrics import Counters
    from dedupnet.adapters.runtime import until_stored

    fps = fingerprint_many(urls(50, tag="oom"))

    def add_steps():
        batch = store.batch()
        added = batch.fingerprints(b"SADD", store.key(FINISH_URL), fps)
        return added.total((yield batch))

    counters = Counters()
    assert store.bucket_bits  # the store's layout recorded (a write) before writes are refused
    before = store.redis.config_get("maxmemory")["maxmemory"]
    store.redis.config_set("maxmemory", 1)  # every write refused: -OOM
    try:
        async with trio.open_nursery() as nursery:
            added = []

            async def add():
                added.append(await until_stored(astore, counters, add_steps))

            nursery.start_soon(add)
            with trio.fail_after(30):
                while counters.get("store_errors") < 2:
                    await trio.sleep(0.01)
            assert not added
            store.redis.config_set("maxmemory", before)
    finally:
        store.redis.config_set("maxmemory", before)
    assert added == [50]
    assert sum("is full" in r.getMessage() for r in caplog.records) == 1  # said once, however often retried
