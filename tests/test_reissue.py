"""A host that is gone has its work re-issued by its center (docs/PROTOCOL.md section 12):
after ``reissue_after`` seconds of silence its ledger goes to the LAN's live hosts, whole
sites at a time; when it comes back it is told what moved and drops it. The core
through the in-memory adapters (the timer fired by hand), then real daemons and Redis."""

from collections import Counter, defaultdict

import trio

from center_host.events import Host, Joined, Left, Received
from center_host.membership import MAX_MESSAGE_URLS, MOVED_NUMBER, SPARE_NUMBERS, reissue_timer
from dedupnet.codec.messages import Ack, Done, Frame, Task
from dedupnet.codec.urls import site_of

from .conformance.memory import MemoryCenter, decode

LAN = "127.0.1.0/24"
HOSTS = ("127.0.1.10", "127.0.1.11", "127.0.1.12")
GONE = "127.0.1.11"
URLS = [f"http://site{i % 17}.example/p{i}" for i in range(120)]


def sent(c):
    return [(str(to), decode(data)) for to, data in c.take_outbox()]


def center_with_work():
    """Three hosts; 120 URLs of 17 sites admitted and acknowledged into their task_pools."""
    c = MemoryCenter.make(network=1, lan=LAN)
    for ip in HOSTS:
        c.feed(Joined(Host(ip), f"{ip}:7701"))
    c.feed(Received(Host(HOSTS[0]), Frame(dict.fromkeys(URLS, 0), HOSTS[0], 1 << 32 | 1 << 16 | 10, 1)))
    for to, msg in sent(c):
        if isinstance(msg, Task):
            c.feed(Received(Host(to), Ack(msg.number, "stored")))
    assert not c.task_URL and c.core.members.ledger[GONE]
    return c


def test_a_host_silent_for_reissue_after_has_its_ledger_moved_by_site_and_drops_it_when_back():
    c = center_with_work()
    held = set(c.core.members.ledger[GONE])
    c.feed(Left(Host(GONE)))
    assert c.timers == {reissue_timer(GONE): 300.0}  # the default: far above heartbeat_timeout
    c.fire(reissue_timer(GONE))
    given = defaultdict(set)
    for to, msg in sent(c):
        assert isinstance(msg, Task) and msg.number in SPARE_NUMBERS
        given[to].update(msg.URLs)
    assert set().union(*given.values()) == held and GONE not in given  # nothing lost
    owners = defaultdict(set)
    for to, urls in given.items():
        for url in urls:
            owners[site_of(url)].add(to)
    assert max(map(len, owners.values())) == 1 and len(given) == 2  # each moved site went whole to one host
    assert GONE not in c.core.members.known and GONE not in c.core.members.ledger
    assert c.moved[GONE] == held and c.core.counters.get("hosts_reissued") == 1
    c.feed(Joined(Host(GONE), f"{GONE}:7701"))  # back, its store kept: told what moved, first
    (first, *_) = sent(c)
    assert first == (GONE, Done(MOVED_NUMBER, tuple(sorted(held))))
    c.feed(Received(Host(GONE), Ack(MOVED_NUMBER, "stored")))
    assert not any(c.moved.values()) and not c.core.members.moved


def test_a_host_back_before_reissue_after_keeps_its_work():
    c = center_with_work()
    held = set(c.core.members.ledger[GONE])
    c.feed(Left(Host(GONE)))
    c.feed(Joined(Host(GONE), f"{GONE}:7701"))
    assert not c.timers and set(c.core.members.ledger[GONE]) == held
    assert not [m for _, m in sent(c) if isinstance(m, (Task, Done))]


def test_a_restarted_center_waits_for_its_hosts_and_remembers_what_moved():
    c = center_with_work()
    c.feed(Left(Host(GONE)))
    c.fire(reissue_timer(GONE))
    moved = set(c.moved[GONE])
    c = c.restart()
    assert c.core.members.moved[GONE] == moved
    assert set(c.timers) >= {reissue_timer(ip) for ip in HOSTS if ip != GONE}  # every known host is away
    c.feed(Joined(Host(HOSTS[0]), f"{HOSTS[0]}:7701"))
    assert reissue_timer(HOSTS[0]) not in c.timers


# -- real daemons ---------------------------------------------------------------------
async def test_a_killed_host_is_reissued_without_an_operator_and_drops_what_moved_when_back(redis_url):
    """One network, two hosts, ``reissue_after`` 1 s: the host killed (its store kept)
    has its tasks given to the other host with no command; restarted, it takes the
    moved tasks out of its task_pool before anything crawls them: every URL once."""
    import random

    from dedupnet.harness.cluster import open_cluster

    async with open_cluster(redis_url, 1, 2, set_size=20, prefix=f"reissue{random.random()}", heartbeat_interval=0.1,
                            heartbeat_timeout=0.5, reissue_after=1.0) as cluster:
        cluster.hosts["127.0.1.10"].pools.push(URLS)
        with trio.fail_after(30):
            await cluster.wait_quiescent()
        gone = cluster.hosts["127.0.1.11"]
        held = {u for _, u in await gone.store.run(gone.pools.all_tasks)}
        assert held
        await cluster.kill("127.0.1.11")
        center = cluster.centers[1]
        with trio.fail_after(30):
            while center.counters.get("hosts_reissued") < 1 or center.core.members.tasks:
                await trio.sleep(0.05)
        live = cluster.hosts["127.0.1.10"]
        assert held <= {u for _, u in await live.store.run(live.pools.all_tasks)}
        back = await cluster.start_host(1, 1)  # the same address and store
        with trio.fail_after(30):
            while await back.store.run(back.pools.all_tasks) or center.core.members.moved:
                await trio.sleep(0.05)
        tasks = Counter()
        for h in cluster.hosts.values():
            tasks.update(u for _, u in await h.store.run(h.pools.all_tasks))
    assert set(tasks) == set(URLS) and max(tasks.values()) == 1


async def test_a_power_cut_between_a_page_and_its_report_loses_no_report(redis_url):
    """A host records pages (finish_URL, task_pool, and their report in tasks_done, one
    transaction) and dies before the report goes; started again on its store it sends
    the report: its center's ledger empties and nothing is given to another host."""
    import random

    from dedupnet.harness.cluster import open_cluster
    from local_host.frontier.tasks import finish_tasks

    async with open_cluster(redis_url, 1, 2, set_size=20, prefix=f"cut{random.random()}", heartbeat_interval=0.1,
                            reissue_after=0) as cluster:
        cluster.hosts["127.0.1.10"].pools.push(URLS)
        with trio.fail_after(30):
            await cluster.wait_quiescent()
        host = cluster.hosts["127.0.1.11"]
        entries = await host.store.run(host.pools.all_tasks)
        urls = [u for _, u in entries]
        store = host.pools.store

        def finish():
            batch = store.batch()
            finish_tasks(batch, store, [i for i, _ in entries], urls, urls, None)
            store.execute(batch)
        # The pages are recorded on the host's disk the instant its power goes: written
        # after the kill, since a living host's report loop may send them first.
        await cluster.kill("127.0.1.11")
        await host.store.run(finish)
        assert await host.store.run(host.pools.tasks_done, 1000) == urls
        center = cluster.centers[1]
        assert set(center.core.members.ledger["127.0.1.11"]) == set(urls)
        back = await cluster.start_host(1, 1)
        with trio.fail_after(30):
            while center.core.members.ledger.get("127.0.1.11"):
                await trio.sleep(0.05)
        assert not await back.store.run(back.pools.tasks_done, 1) and not center.core.members.tasks
        assert center.counters.get("tasks_reported") == len(urls) and center.counters.get("ledger_moved") == 0


def test_a_large_ledger_moves_in_messages_a_host_takes():
    """12,000 unfinished URLs: the re-issue's tasks and the list a returning host is sent
    are each within what a host takes (max_urls 10,000 by default), with numbers of their
    own; each ack takes its part off."""
    c = MemoryCenter.make(network=1, lan=LAN)
    for ip in ("127.0.1.10", GONE):
        c.feed(Joined(Host(ip), f"{ip}:7701"))
    c.feed(Left(Host("127.0.1.10")))  # so that every URL goes to GONE
    urls = [f"http://big{i % 40}.example/p{i}" for i in range(12_000)]
    for seq in range(3):
        part = urls[seq * 4000:(seq + 1) * 4000]
        c.feed(Received(Host(GONE), Frame(dict.fromkeys(part, 0), GONE, (seq + 1) << 32 | 1 << 16 | 11, 1)))
        for to, msg in sent(c):
            if isinstance(msg, Task):
                c.feed(Received(Host(to), Ack(msg.number, "stored")))
    c.feed(Joined(Host("127.0.1.10"), "127.0.1.10:7701"))
    c.feed(Left(Host(GONE)))
    sent(c)
    c.fire(reissue_timer(GONE))
    tasks = [m for _, m in sent(c) if isinstance(m, Task)]
    assert len(tasks) == 3 and max(len(t.URLs) for t in tasks) <= MAX_MESSAGE_URLS
    assert len({t.number for t in tasks}) == 3 and all(t.number in SPARE_NUMBERS for t in tasks)
    assert sorted(u for t in tasks for u in t.URLs) == sorted(urls)
    c.feed(Joined(Host(GONE), f"{GONE}:7701"))
    lists = [m for _, m in sent(c) if isinstance(m, Done)]
    assert len(lists) == 3 and max(len(d.URLs) for d in lists) <= MAX_MESSAGE_URLS
    for d in lists[:2]:
        c.feed(Received(Host(GONE), Ack(d.number, "stored")))
    assert c.core.members.moved[GONE] == set(lists[2].URLs)
    c.feed(Received(Host(GONE), Ack(lists[2].number, "stored")))
    assert not c.core.members.moved
