"""What a peer sends is checked where it enters a center: URLs in the form a host
stores them, numbers bound to their sender, a number reused after a host lost its
store never taken for a repeat (docs/PROTOCOL.md §7, §8). Real daemons, real TCP."""

import random
from contextlib import asynccontextmanager

import trio

from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.net.transport import connect
from dedupnet.codec import wire
from dedupnet.codec.messages import Ack, Frame, Register, Task
from dedupnet.codec.numbers import make_number
from dedupnet.harness.cluster import open_cluster

HOST = "127.0.1.10"  # the cluster's own host of network 1
CLIENT = "127.0.1.21"  # a host of network 1 played by the test


class Client:
    """A LAN host played by the test: it sends sets, and reads what the center sends
    (acknowledging its tasks, as a host does)."""

    def __init__(self, conn, ip):
        self.conn, self.ip = conn, ip
        self.acks: dict[int, Ack] = {}
        self.tasks: list[str] = []
        self.changed = trio.Event()

    async def read(self):
        while True:
            message = await self.conn.receive()
            if isinstance(message, Ack):
                self.acks[message.number] = message
            elif isinstance(message, Task):
                self.tasks += message.URLs
                self.conn.send_nowait(wire.encode(Ack(message.number, "stored")))
            self.changed.set()
            self.changed = trio.Event()

    def send(self, urls, sequence, host_id=21) -> int:
        number = make_number(1, host_id, sequence)
        self.conn.send_nowait(wire.encode(Frame(dict.fromkeys(urls, 0), self.ip, number, 1)))
        return number

    async def ack(self, number) -> Ack:
        while number not in self.acks:
            await self.changed.wait()
        return self.acks[number]


@asynccontextmanager
async def registered_client(center, ip=CLIENT):
    register = Register(ip, 1, "host", f"{ip}:1", "127.0.1.0/24")
    async with await connect(center.settings.ip, center.port, register, local_ip=ip, counters=Counters()) as conn:
        while ip not in center.core.members.hosts:
            await trio.sleep(0.01)
        client = Client(conn, ip)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.read)
            yield client
            nursery.cancel_scope.cancel()


async def all_tasks(system, client) -> list[str]:
    return client.tasks + [u for h in system.hosts.values() for _, u in await h.store.run(h.pools.all_tasks)]


def cluster(redis_url, hosts=1):
    return open_cluster(redis_url, 1, hosts, set_size=20, prefix=f"entry{random.random()}")


async def test_urls_are_normalised_where_they_enter_and_bad_ones_counted(redis_url):
    async with cluster(redis_url) as system:
        center = system.centers[1]
        async with registered_client(center) as client:
            with trio.fail_after(30):
                number = client.send(["javascript:alert(1)", "HTTP://Norm.Example:80/a/./b#f",
                                      "http://long.example/" + "x" * 5000], 1)
                assert (await client.ack(number)).status == "stored"
                await system.wait_quiescent()
                assert center.counters.get("bad_input", reason="bad-url") == 2
                assert await all_tasks(system, client) == ["http://norm.example/a/b"]
                number = client.send(["http://norm.example/a/b"], 2)
                assert (await client.ack(number)).status == "stored"
                await system.wait_quiescent()
                assert await all_tasks(system, client) == ["http://norm.example/a/b"]
        assert center.counters.get("urls_admitted") == 1  # the normal spelling: a duplicate
        assert center.counters.get("urls_dropped", stage="center-record") == 1


async def test_a_number_with_another_hosts_bits_is_refused_and_costs_that_host_nothing(redis_url):
    async with cluster(redis_url) as system:
        center = system.centers[1]
        host = system.hosts[HOST]
        async with registered_client(center) as client:
            with trio.fail_after(30):
                # The client sends a set under the number the host will use first.
                client.send(["http://spoof.example/"], 1, host_id=10)
                while not center.counters.get("rejected", reason="number-not-sender"):
                    await trio.sleep(0.01)
                await host.store.run(host.pools.push, ["http://victim.example/"])
                await system.wait_quiescent()
                assert await all_tasks(system, client) == ["http://victim.example/"]
        assert center.counters.get("rejected", reason="number-not-sender") == 1
        assert center.counters.get("urls_admitted") == 1  # the host's URL, not the spoofer's


async def test_a_host_restarted_on_an_empty_store_loses_none_of_its_new_urls(redis_url):
    async with cluster(redis_url) as system:
        center = system.centers[1]
        host = system.hosts[HOST]
        first = [f"http://before.example/{i}" for i in range(50)]
        with trio.fail_after(60):
            await host.store.run(host.pools.push, first)
            await system.wait_quiescent()
            assert center.counters.get("urls_admitted") == 50
            # The host's Redis data is lost (disk replaced, FLUSHALL): its sequence starts again.
            await system.kill(HOST)
            system.stores[f"host:{HOST}"].delete_prefix()
            host = await system.start_host(1, 0)
            then = [f"http://after.example/{i}" for i in range(50)]
            await host.store.run(host.pools.push, then)
            await system.wait_quiescent()
        assert center.counters.get("urls_admitted") == 100  # every new URL admitted: 0 lost
        assert center.counters.get("rejected", reason="number-reused") >= 1
        assert host.counters.get("sets_renumbered") >= 1
        assert set(then) <= {u for _, u in await host.store.run(host.pools.all_tasks)}


def test_a_host_checks_the_urls_of_tasks_and_requests_as_a_center_does():
    from local_host import protocol as hp

    from .conformance.memory import MemoryHost

    h = MemoryHost.make(ip="127.0.1.11", network=1, host_id=11, mode="exact")
    h.feed(hp.FromCenter(Task(5, ("javascript:alert(1)", "HTTP://A.example:80/x#f"))))
    assert h.task_pool == ["http://a.example/x"]
    h.feed(hp.FromCenter(Frame({"mailto:x@y": 0, "http://A.example/x": 0}, "127.0.1.10", 6, 2)))
    (answer,) = [wire.decode_one(d) for d in h.take_outbox() if isinstance(wire.decode_one(d), Frame)]
    assert answer.URL_set == {"http://a.example/x": 1}  # queued here already: seen
    assert h.core.counters.get("bad_input", reason="bad-url") == 2


def test_a_host_cannot_fill_the_centers_memory_with_held_sets():
    from center_host.events import Host, Joined, Received
    from center_host.sets import MAX_HELD_PER_HOST

    from .conformance.memory import MemoryCenter

    c = MemoryCenter.make(network=1, lan="127.0.1.0/24", max_in_flight=1, local_lookup="lan")
    c.feed(Joined(Host("127.0.1.10")))
    c.feed(Joined(Host("127.0.1.11")))  # asked about the first set, never answers: the center is full
    for seq in range(1, MAX_HELD_PER_HOST + 10):
        c.feed(Received(Host("127.0.1.10"), Frame({f"http://a.example/{seq}": 0}, "127.0.1.10",
                                                         make_number(1, 10, seq), 1)))
    assert len(c.core.stages.waiting) == MAX_HELD_PER_HOST  # one in flight, the rest held up to the bound
    assert c.core.counters.get("rejected", reason="too-many-held") == 8
