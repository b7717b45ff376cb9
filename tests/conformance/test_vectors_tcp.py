"""Runner 2: the same vectors against the REAL daemons, over TCP on loopback and Redis.

The party under test is a CenterDaemon or a LocalDaemon with a real Store (its own key
prefix). Every other party of a vector is played here with dedupnet.adapters.net.transport: LAN hosts
connect to the center with a "host" Register bound to their IP; a peer network connects
with a "center" Register (the peers in these vectors have lower network ids, and of two
centers the lower id dials); a host under test connects to a fake center listening with
transport.serve. Initial pools are written with the daemons' own pools code, final pools
are read back from Redis.

Per step: send the input, wait until the daemon has processed it (a tap on its reactor
counts the events it finished), collect what the fake parties receive until the
expected messages are there (every wait under a deadline), allow a short grace for
anything unexpected, compare. Timers never fire here (answer timeouts and heartbeats
are set to an hour), so vectors with a ``timer`` step are skipped, as are the few marked
``"tcp": false``.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from functools import partial

import numpy as np
import orjson
import pytest
import trio

from center_host.events import Admit, Conclude
from center_host.sets import SetRecord
from center_host.daemon import CenterDaemon, CenterSettings, PeerAddress
from center_host.pools import ADMITTED, CONCLUDED, CenterPools
from dedupnet.codec import wire
from dedupnet.codec.messages import Error, Heartbeat, Register
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.storage.store import DIST_REDUCE_POOL, LOCAL_REDUCE_POOL, TASK_POOL, TASK_URL, URL_POOL
from dedupnet.adapters.net.transport import ConnectionClosed, connect, serve
from dedupnet.codec.urls import fingerprint_many
from local_host import protocol as hp
from local_host.frontier import sites
from local_host.daemon import LocalDaemon, LocalSettings
from local_host.pools import UNACKED, HostPools

from ..helpers import until
from .vectors import (assert_sent, cases, counter_mismatches, expected_sent, message, observed_sent, pick,
                      pools_mismatch)

TIMEOUT = 5.0  # every wait
GRACE = 0.02  # after the expected messages arrived, for anything unexpected to show up
HOUR = 3600.0


def tcp_skip(vector, mode) -> str | None:
    if vector.get("tcp") is False:
        return vector["tcp_reason"]
    if vector.has_timer():
        return "needs a timer firing (run by the core runner only)"
    if vector["role"] == "center" and any(int(n) > vector["config"]["network"] for n in vector["config"].get("peers", {})):
        return "a peer with a higher network id would have to listen for the center under test"
    if vector["role"] == "host" and vector["initial"].get("URL_pool") and "walk" not in vector["steps"][0]:
        return "the daemon's walker takes URL_pool as soon as it is connected: the first step must be the walk"
    return None


def first_address(cidr: str) -> str:
    return str(next(ipaddress.ip_network(cidr).hosts()))


def in_thread(fn, *args):
    return trio.to_thread.run_sync(partial(fn, *args))


class Tap:
    """Counts the events the daemon's reactor has finished processing, by type."""

    def __init__(self, reactor):
        self.done: Counter[str] = Counter()
        self.want: Counter[str] = Counter()
        process = reactor.process

        async def counted(event):
            await process(event)
            self.done[type(event).__name__] += 1
        reactor.process = counted

    async def settle(self) -> None:
        await until(lambda: all(self.done[k] >= n for k, n in self.want.items()), TIMEOUT, poll=0.005,
                    what=f"the daemon to process {dict(self.want)} (done: {dict(self.done)})")


class Fakes:
    """The other parties: one connection each, and everything they received."""

    def __init__(self, nursery):
        self.nursery = nursery
        self.conns = {}
        self.scopes = {}
        self.received: list[tuple[str, object]] = []

    async def _run(self, name, conn, task_status=trio.TASK_STATUS_IGNORED):
        with trio.CancelScope() as scope:
            self.scopes[name] = scope
            async with conn:
                task_status.started()
                await self.session(name, conn)

    async def session(self, name, conn):
        self.conns[name] = conn
        try:
            while True:
                msg = await conn.receive()
                if not isinstance(msg, (Heartbeat, Register)):
                    self.received.append((name, msg))
        except ConnectionClosed:
            pass

    async def dial(self, name, port, register: Register, to_ip: str):
        conn = await connect(to_ip, port, register, local_ip=register.IP, counters=Counters())
        await self.nursery.start(self._run, name, conn)

    def close(self, name):
        self.scopes.pop(name).cancel()
        del self.conns[name]

    def send(self, name, data: bytes):
        assert self.conns[name].send_nowait(data), f"connection of {name} is closed"

    async def collect(self, count: int) -> list:
        """What arrived once ``count`` messages are there (or the deadline passed), after a grace."""
        with trio.move_on_after(TIMEOUT):
            while len(self.received) < count:
                await trio.sleep(0.005)
        await trio.sleep(GRACE)
        got, self.received = self.received, []
        return got


def urls_and_numbers(obj, urls: set, numbers: set):
    """Every URL and integer a vector mentions: the universe its Redis fingerprints map back to."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            urls_and_numbers(k, urls, numbers)
            urls_and_numbers(v, urls, numbers)
    elif isinstance(obj, list):
        for v in obj:
            urls_and_numbers(v, urls, numbers)
    elif isinstance(obj, str):
        if obj.startswith("http"):
            urls.add(obj)
        elif obj.isdigit():
            numbers.add(int(obj))
    elif isinstance(obj, int) and obj >= 0:
        numbers.add(obj)


# -- the center under test ---------------------------------------------------------------------
class CenterUnderTest:
    def __init__(self, vector, mode, store, nursery):
        self.vector, self.store, self.cfg = vector, store, vector["config"]
        self.ip = first_address(self.cfg["lan"])
        peers = [PeerAddress(int(n), first_address(c), 0, c) for n, c in self.cfg.get("peers", {}).items()]
        settings = CenterSettings(self.cfg["network"], self.ip, 0, self.cfg["lan"], peers, mode=mode,
                                  answer_timeout=HOUR, heartbeat_interval=HOUR, heartbeat_timeout=2 * HOUR,
                                  max_resends=self.cfg.get("max_resends", 2),
                                  partition_policy=self.cfg.get("partition_policy"),
                                  foreign_lookup=self.cfg.get("foreign_lookup"),
                                  local_lookup=self.cfg.get("local_lookup"), routing=self.cfg.get("routing"))
        self.daemon = CenterDaemon(settings, store)
        self.tap = Tap(self.daemon.reactor)
        self.fakes = Fakes(nursery)
        self.nursery = nursery
        self.urls, self.numbers = set(), set()
        urls_and_numbers(vector.data, self.urls, self.numbers)

    @property
    def counters(self):
        return self.daemon.counters

    async def start(self):
        init = self.vector["initial"]
        writes = [Admit(0, tuple(init.get("admitted", [])))]
        writes += [Conclude(n, True) for n in init.get("concluded", [])]
        await in_thread(CenterPools(self.store).apply, writes)
        self.port = await self.nursery.start(self.daemon.run)
        self.tap.want["Resume"] += 1
        for ip in init.get("hosts", []):
            await self.join(ip)
        for n in init.get("peers", []):
            await self.join(f"net:{n}")
        await self.tap.settle()

    async def join(self, who: str):
        if who.startswith("net:"):
            n = int(who[4:])
            cidr = self.cfg["peers"][str(n)]
            ip = first_address(cidr)
            # A peer routes by the same home map as the center under test (or broadcasts as it does).
            register = Register(ip, n, "center", f"{ip}:1", cidr, homes=self.daemon.register().homes)
        else:
            register = Register(who, self.cfg["network"], "host", f"{who}:1", self.cfg["lan"])
        await self.fakes.dial(who, self.port, register, self.ip)
        self.tap.want["Joined"] += 1

    async def step(self, step, mode):
        if "message" in step:
            self.fakes.send(step["from"], wire.encode(message(pick(step["message"], mode))))
            self.tap.want["Received"] += 1
        elif "raw_hex" in step:  # the daemon answers with an Error and closes: the sender leaves
            self.fakes.send(step["from"], bytes.fromhex(step["raw_hex"]))
            self.tap.want["Left"] += 1
        elif "join" in step:
            await self.join(step["join"])
        elif "leave" in step:
            self.fakes.close(step["leave"])
            self.tap.want["Left"] += 1
        await self.tap.settle()

    def pools(self) -> dict:
        r, key = self.store.redis, self.store.key

        def frames(pool):
            return {int(n): SetRecord.load(v).frame.URL_set for n, v in r.hgetall(key(pool)).items()}

        def members(pool, values, fps):
            flags = self.store.fp_contains(pool, fps) if len(fps) else []
            found = [v for v, f in zip(values, flags) if f]
            return found + ["<not in the vector>"] * (self.store.fp_count(pool) - len(found))

        urls = sorted(self.urls)
        numbers = sorted(self.numbers)
        return {
            "local_reduce_pool": frames(LOCAL_REDUCE_POOL), "dist_reduce_pool": frames(DIST_REDUCE_POOL),
            "admitted": members(ADMITTED, urls, fingerprint_many(urls)),
            "concluded": members(CONCLUDED, numbers, np.array(numbers, dtype=np.uint64)),
            "task_URL": {k.decode(): orjson.loads(v) for k, v in r.hgetall(key(TASK_URL)).items()},
            "ledger": CenterPools(self.store).ledger(),
        }


# -- the host under test -----------------------------------------------------------------------
class HostUnderTest:
    def __init__(self, vector, mode, store, nursery):
        self.vector, self.mode, self.store, self.cfg = vector, mode, store, vector["config"]
        self.center_ip = first_address(self.cfg["lan"])
        self.pools_ = HostPools(store, exact=mode == "exact")
        self.fakes = Fakes(nursery)
        self.nursery = nursery

    @property
    def counters(self):
        return self.daemon.counters

    async def start(self):
        init = self.vector["initial"]
        await in_thread(self.pools_.setup)
        await in_thread(self.pools_.finish, init.get("finish_URL", []))
        await in_thread(self.pools_.apply, [hp.AddTasks(tuple(init.get("task_pool", [])))])
        await in_thread(self.pools_.push, init.get("URL_pool", []))
        port = await self.nursery.start(partial(serve, counters=Counters(), accept_roles=("host",)),
                                        self.center_ip, 0, partial(self.fakes.session, "center"))
        c = self.cfg
        settings = LocalSettings(c["network"], c["ip"], c["lan"], (self.center_ip, port), host_id=c["host_id"],
                                 set_size=c["set_size"], mode=self.mode, heartbeat_interval=HOUR, idle_poll=0.01)
        self.daemon = LocalDaemon(settings, self.store)
        self.tap = Tap(self.daemon.reactor)
        await self.nursery.start(self.daemon.run)
        self.tap.want["Connected"] += 1
        await self.tap.settle()

    async def step(self, step, mode):
        if "message" in step:
            self.fakes.send("center", wire.encode(message(pick(step["message"], mode))))
            self.tap.want["FromCenter"] += 1
        elif "raw_hex" in step:  # the host answers with an Error, closes, and connects again
            self.fakes.send("center", bytes.fromhex(step["raw_hex"]))
        elif "walk" in step:  # the daemon's walker takes URL_pool by itself once connected
            self.tap.want["Found"] += 1
        elif "reconnect" in step:
            await self.fakes.conns.pop("center").aclose()
            self.tap.want["Connected"] += 1
        await self.tap.settle()

    def pools(self) -> dict:
        r, key = self.store.redis, self.store.key

        def stream(pool):
            return [fields[b"u"].decode() for _, fields in r.xrange(key(pool))]
        return {"URL_pool": stream(URL_POOL), "task_pool": stream(TASK_POOL) + sites.queued_urls(self.store),
                "unacked": [int(n) for n in r.hkeys(key(UNACKED))]}


# -- the runner --------------------------------------------------------------------------------
@pytest.mark.parametrize("vector, mode", cases(skip=tcp_skip))
async def test_vector(vector, mode, store):
    failure = None
    async with trio.open_nursery() as nursery:
        try:
            await play(vector, mode, store, nursery)
        except (AssertionError, pytest.fail.Exception) as e:
            failure = e  # raised below, not wrapped in the nursery's exception group
        nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure


async def play(vector, mode, store, nursery):
    party = (CenterUnderTest if vector["role"] == "center" else HostUnderTest)(vector, mode, store, nursery)
    await party.start()
    for i, step in enumerate(vector["steps"], 1):
        where = f"{vector.id} [{mode}] step {i}"
        await party.step(step, mode)
        want = expected_sent(step, mode)
        got = await party.fakes.collect(len(want) + ("raw_hex" in step))
        if "raw_hex" in step:
            errors = [(to, m) for to, m in got if isinstance(m, Error)]
            assert [(to, m.reason) for to, m in errors] == [(step["from"], step["expect_error"])], where
            assert party.counters.get("bad_input", reason=step["expect_error"]) == 1, where
            got = [x for x in got if x not in errors]
        assert_sent(where, observed_sent(got), want)
        bad = counter_mismatches(party.counters, pick(step.get("expect_counters", {}), mode))
        assert not bad, f"{where}: counters (actual, expected): {bad}"
        if "expect_pools" in step:
            diff = pools_mismatch(await in_thread(party.pools), pick(step["expect_pools"], mode))
            assert diff is None, f"{where}: pools in Redis differ\n{diff}"
    diff = pools_mismatch(await in_thread(party.pools), pick(vector["final"], mode))
    assert diff is None, f"{vector.id} [{mode}] final pools in Redis differ\n{diff}"
    assert_sent(f"{vector.id} [{mode}] after the last step", observed_sent(party.fakes.received), [])
