"""The sans-I/O cores driven directly: the properties the conformance vectors sample."""

from collections import Counter

import pytest

from center_host.events import Host, Joined, Left, Peer, Received
from center_host.membership import reissue_timer
from dedupnet.codec.messages import Ack, Frame, Task
from local_host import protocol as hp

from .conformance.memnet import MemNet
from .conformance.memory import MemoryCenter, MemoryHost, decode


def num(ip, seq):
    """Set ``seq`` of the LAN host (or a peer network's host) ``ip``: the number its
    center accepts from it (docs/PROTOCOL.md §7)."""
    _, _, network, host = map(int, ip.split("."))
    return seq << 32 | network << 16 | host


def urls(*names):
    return [f"http://site{n % 5}.example/{n}" for n in names]


@pytest.mark.parametrize("mode", ["exact", "exact-lan", "exact-broadcast", "exact-broadcast-lan", "paper"])
@pytest.mark.parametrize("seed", range(60))
def test_concurrent_discovery_random_interleavings(mode, seed):
    lookup = "lan" if mode.endswith("-lan") else None
    routing = "broadcast" if "broadcast" in mode or mode == "paper" else "home"  # exact broadcast gathers (R4)
    mode = mode.split("-")[0]
    net = MemNet(3, 3, mode=mode, seed=seed, max_in_flight=1 + seed % 3, foreign_lookup=lookup, local_lookup=lookup,
                 routing=routing)
    shared = urls(*range(12))
    for i, host in enumerate(net.hosts.values()):
        host.push(net.rnd.sample(shared, 8) + urls(100 + i))
    net.run()
    admitted = Counter(net.admitted())
    expected = set(shared) | {u for i in range(len(net.hosts)) for u in urls(100 + i)}
    assert set(admitted) == expected  # no loss, in both modes
    queued = Counter(net.task_pools())
    assert set(queued) == set(admitted)
    if mode == "exact":
        assert max(admitted.values()) == 1, admitted.most_common(3)
        assert queued == admitted  # every admitted URL in exactly one task_pool
    else:  # admitted twice in one network: same site, same host, which queues it once
        assert all(queued[u] <= admitted[u] for u in queued)
    # Nothing left in flight anywhere.
    for c in net.centers.values():
        assert not c.local_reduce_pool and not c.dist_reduce_pool and not c.core.stages.sets
    for h in net.hosts.values():
        assert not h.URL_pool and not h.unacked


def check_exact_and_nothing_lost(net: MemNet, pushed: set[str]) -> Counter:
    admitted = Counter(net.admitted())
    assert set(admitted) == pushed  # nothing lost
    for c in net.centers.values():
        assert not c.local_reduce_pool and not c.dist_reduce_pool and not c.core.stages.sets and not c.timers
    return admitted


def push_shared(net: MemNet) -> set[str]:
    shared = urls(*range(16))
    for i, host in enumerate(net.hosts.values()):
        host.push(net.rnd.sample(shared, 10) + urls(100 + i))
    return set(shared) | {u for i in range(len(net.hosts)) for u in urls(100 + i)}


@pytest.mark.parametrize("lookup", ["center", "lan"])
@pytest.mark.parametrize("seed", range(30))
def test_exact_under_late_answers_and_partitions(seed, lookup):
    """Slow is not dead: timers fire while answers are on their way, and WAN links are
    cut (what was on them is lost) and healed. Exact mode ("wait") still admits every
    URL exactly once and concludes nothing incomplete, whoever answers the sets (the
    center's records, or every host: foreign_lookup and local_lookup)."""
    net = MemNet(3, 3, mode="exact", seed=seed, early_timers=0.3, partitions=0.03, max_in_flight=1 + seed % 4,
                 foreign_lookup=lookup, local_lookup=lookup)
    pushed = push_shared(net)
    net.run()
    net.settle()
    admitted = check_exact_and_nothing_lost(net, pushed)
    assert max(admitted.values()) == 1, admitted.most_common(3)
    assert sum(c.core.counters.get("sets_concluded", complete="false") for c in net.centers.values()) == 0


def test_admit_policy_under_the_same_faults_concludes_incomplete_and_says_so():
    """The "admit" policy (paper's time limit) loses nothing either, but concludes sets
    without late or cut-off networks, counts them, and so may admit a URL twice."""
    incomplete = dups = 0
    for seed in range(40):
        net = MemNet(3, 3, mode="exact", seed=seed, early_timers=0.3, partitions=0.03, partition_policy="admit",
                     routing="broadcast")
        pushed = push_shared(net)
        net.run()
        net.settle()
        admitted = check_exact_and_nothing_lost(net, pushed)
        dups += sum(n - 1 for n in admitted.values())
        incomplete += sum(c.core.counters.get("sets_concluded", complete="false") for c in net.centers.values())
    assert incomplete > 0 and dups > 0


def test_paper_mode_duplicates_do_happen_and_are_visible():
    dups = 0
    for seed in range(40):
        net = MemNet(2, 2, mode="paper", seed=seed)
        for host in net.hosts.values():
            host.push(urls(1, 2, 3))
        net.run()
        dups += sum(c - 1 for c in Counter(net.admitted()).values())
    assert dups > 0


def test_crawled_urls_are_removed_at_the_stage_the_paper_says():
    net = MemNet(2, 3, mode="paper", seed=1)
    a, b = net.hosts["127.0.1.10"], net.hosts["127.0.1.11"]
    far = net.hosts["127.0.2.10"]
    local_done, lan_done, far_done, new = urls(1, 2, 3, 4)
    a.finish_URL.add(local_done)
    b.finish_URL.add(lan_done)
    far.finish_URL.add(far_done)
    a.push([local_done, lan_done, far_done, new])
    net.run()
    assert net.admitted() == [new]
    assert a.core.counters.get("urls_dropped", stage="host") == 1  # §2.2
    c1 = net.centers[1].core.counters
    assert c1.get("urls_dropped", stage="lan") == 1  # §2.3
    assert c1.get("urls_dropped", stage="dist") == 1  # §2.4


def center(**kw):
    """A center of three hosts whose own sets go through the LAN stage (``local_lookup``
    "lan"): the tests below are about members that answer late or not at all."""
    cfg = dict(network=1, lan="127.0.1.0/24", peers={2: "127.0.2.0/24"}, mode="exact", local_lookup="lan")
    cfg.update(kw)
    c = MemoryCenter.make(**cfg)
    for ip in ("127.0.1.10", "127.0.1.11", "127.0.1.12"):
        c.feed(Joined(Host(ip)))
    return c


def sent(c):
    return [(str(to), decode(data)) for to, data in c.take_outbox()]


def test_silent_host_set_concludes_after_resends_under_admit():
    c = center(peers={}, max_resends=2, partition_policy="admit")
    c.feed(Received(Host("127.0.1.10"), Frame({"http://a.example/": 0}, "127.0.1.10", num("127.0.1.10", 7), 1)))
    out = sent(c)
    assert ("127.0.1.10", Ack(num("127.0.1.10", 7), "stored")) in out
    assert sorted(to for to, m in out if isinstance(m, Frame)) == ["127.0.1.11", "127.0.1.12"]
    c.feed(Received(Host("127.0.1.11"), Frame({"http://a.example/": 0}, "127.0.1.10", num("127.0.1.10", 7), 3)))
    sent(c)
    for attempt in range(2):  # re-sent to the silent host only
        c.fire(num("127.0.1.10", 7))
        assert [to for to, m in sent(c) if isinstance(m, Frame)] == ["127.0.1.12"]
    c.fire(num("127.0.1.10", 7))
    assert c.core.counters.get("concluded_incomplete", stage="lan") == 1
    assert c.admitted == {"http://a.example/"} and not c.timers and not c.local_reduce_pool


def test_silent_live_host_is_waited_for_with_backoff():
    """"wait" (exact's default): a host that is alive but slow is asked again, less and
    less often, and the set concludes complete once it answers — never without it."""
    c = center(peers={}, max_resends=1, answer_timeout=2.0, max_resend_interval=10.0)
    c.feed(Received(Host("127.0.1.10"), Frame({"http://a.example/": 0}, "127.0.1.10", num("127.0.1.10", 7), 1)))
    c.feed(Received(Host("127.0.1.11"), Frame({"http://a.example/": 0}, "127.0.1.10", num("127.0.1.10", 7), 3)))
    sent(c)
    delays = []
    for _ in range(6):
        delays.append(c.timers[num("127.0.1.10", 7)])
        c.fire(num("127.0.1.10", 7))
        assert [to for to, m in sent(c) if isinstance(m, Frame)] == ["127.0.1.12"]
    assert delays == [2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    assert not c.admitted and num("127.0.1.10", 7) in c.core.stages.sets and c.core.stages.waiting_for() == {"127.0.1.12": 1}
    c.feed(Received(Host("127.0.1.12"), Frame({"http://a.example/": 0}, "127.0.1.10", num("127.0.1.10", 7), 3)))
    assert c.admitted == {"http://a.example/"} and not c.timers
    assert c.core.counters.get("sets_concluded", complete="true") == 1


def test_set_waits_for_a_peer_network_that_is_down():
    """"wait": a set whose peer network is down stays in dist_reduce_pool, asks nobody,
    admits nothing; one that reaches the stage meanwhile gathers behind it (R4: it goes
    once nothing of ours is out). When the network is back the first is asked, then the
    second, and both conclude complete."""
    c = center(peers={2: "127.0.2.0/24"}, routing="broadcast")
    c.feed(Joined(Peer(2)))
    first = Frame({"http://a.example/": 0}, "127.0.1.10", num("127.0.1.10", 7), 1)
    c.feed(Received(Host("127.0.1.10"), first))
    for ip in ("127.0.1.11", "127.0.1.12"):
        c.feed(Received(Host(ip), first.with_flag(3)))
    assert [to for to, m in sent(c) if isinstance(m, Frame)][-1:] == ["net:2"]
    c.feed(Left(Peer(2)))
    second = Frame({"http://b.example/": 0}, "127.0.1.11", num("127.0.1.11", 8), 1)
    c.feed(Received(Host("127.0.1.11"), second))
    for ip in ("127.0.1.10", "127.0.1.12"):
        c.feed(Received(Host(ip), second.with_flag(3)))
    sent(c)
    for _ in range(5):
        for n in list(c.timers):
            c.fire(n)
    assert not [m for _, m in sent(c) if isinstance(m, (Frame, Task))]
    assert not c.admitted and sorted(c.dist_reduce_pool) == [num("127.0.1.10", 7)]
    assert list(c.local_reduce_pool) == [num("127.0.1.11", 8)] and list(c.core.stages.gathering) == [num("127.0.1.11", 8)]
    assert c.core.stages.waiting_for() == {"net:2": 1}
    c.feed(Joined(Peer(2)))
    for number in (num("127.0.1.10", 7), num("127.0.1.11", 8)):
        (asked,) = [m for to, m in sent(c) if isinstance(m, Frame)]
        assert asked.number == number
        c.feed(Received(Peer(2), asked.with_flag(3)))
    assert c.admitted == {"http://a.example/", "http://b.example/"} and not c.dist_reduce_pool
    assert c.core.counters.get("sets_concluded", complete="true") == 2


def test_a_network_removed_from_the_configuration_is_no_longer_waited_for():
    c = center(peers={2: "127.0.2.0/24"})
    f = Frame({"http://a.example/": 0}, "127.0.1.10", num("127.0.1.10", 7), 1)
    c.feed(Received(Host("127.0.1.10"), f))
    for ip in ("127.0.1.11", "127.0.1.12"):
        c.feed(Received(Host(ip), f.with_flag(3)))
    assert num("127.0.1.10", 7) in c.dist_reduce_pool  # network 2 never connected: waited for
    c = c.restart(peers={})  # the operator removes it and restarts the center
    c.fire(num("127.0.1.10", 7))
    assert c.admitted == {"http://a.example/"}


@pytest.mark.parametrize("sender, frame, reason", [
    (Host("127.0.1.11"), Frame({"http://a/": 0}, "127.0.1.10", 99, 3), "unknown-number"),
    (Host("127.0.1.11"), Frame({"http://a/": 0}, "127.0.1.11", 9, 2), "flag2-from-lan"),
    (Host("127.0.1.11"), Frame({"http://a/": 0}, "127.0.1.10", 9, 1), "ip-mismatch"),
    (Peer(2), Frame({"http://a/": 0}, "127.0.3.5", 9, 2), "not-a-peer"),
    (Peer(2), Frame({"http://a/": 0}, "127.0.1.10", 9, 2), "flag2-own-network"),
])
def test_illegal_input_is_rejected_by_name(sender, frame, reason):
    c = center(routing="broadcast")  # flag=2 between networks: the look-ups of §10
    c.feed(Received(sender, frame))
    assert c.core.counters.get("rejected", reason=reason) == 1
    assert not c.outbox and not c.local_reduce_pool and not c.dist_reduce_pool


def test_answer_from_a_host_that_was_not_asked_and_repeated_answers():
    c = center(peers={})
    c.feed(Received(Host("127.0.1.10"), Frame({"http://a/": 0, "http://b/": 0}, "127.0.1.10", num("127.0.1.10", 5), 1)))
    sent(c)
    c.feed(Received(Host("127.0.1.10"), Frame({"http://a/": 1}, "127.0.1.10", num("127.0.1.10", 5), 3)))  # the origin was not asked
    assert c.core.counters.get("rejected", reason="not-asked") == 1
    c.feed(Received(Host("127.0.1.11"), Frame({"http://a/": 1, "http://b/": 0}, "127.0.1.10", num("127.0.1.10", 5), 3)))
    c.feed(Received(Host("127.0.1.11"), Frame({"http://a/": 0, "http://b/": 1}, "127.0.1.10", num("127.0.1.10", 5), 3)))
    assert c.core.counters.get("repeated_answers") == 1
    c.feed(Received(Host("127.0.1.12"), Frame({"http://a/": 0, "http://b/": 0}, "127.0.1.10", num("127.0.1.10", 5), 3)))
    assert c.admitted == {"http://b/"}


def test_a_late_answer_is_counted_quietly_an_unknown_one_loudly(caplog):
    """Both are ``rejected{reason="unknown-number"}`` (the conformance vectors count them
    alike); only an answer for a number never held here is a warning in the log."""
    c = center(peers={})
    f = Frame({"http://a/": 0}, "127.0.1.10", num("127.0.1.10", 5), 1)
    c.feed(Received(Host("127.0.1.10"), f))
    for ip in ("127.0.1.11", "127.0.1.12"):
        c.feed(Received(Host(ip), f.with_flag(3)))
    assert c.admitted == {"http://a/"}
    with caplog.at_level("DEBUG", logger="dedupnet.center"):
        c.feed(Received(Host("127.0.1.12"), f.with_flag(3)))  # a re-sent question answered again
        c.feed(Received(Host("127.0.1.12"), Frame({"http://a/": 0}, "127.0.1.10", 6, 3)))  # never held
    assert c.core.counters.get("rejected", reason="unknown-number") == 2
    logged = [(r.levelname, "late answer" in r.getMessage()) for r in caplog.records if "rejected" in r.getMessage()]
    assert logged == [("DEBUG", True), ("WARNING", False)]


def test_foreign_request_inverted_sentence_resolved():
    """§2.4 gap 1: a non-zero answer marks the URL seen; zero leaves it unseen."""
    c = center(mode="paper")
    c.feed(Joined(Peer(2)))
    c.feed(Received(Peer(2), Frame({"http://a/": 0, "http://b/": 0}, "127.0.2.10", num("127.0.2.10", 11), 2)))
    assert sorted(to for to, m in sent(c)) == ["127.0.1.10", "127.0.1.11", "127.0.1.12"]
    for ip, seen in (("127.0.1.10", {"http://a/": 1, "http://b/": 0}), ("127.0.1.11", {"http://a/": 0, "http://b/": 0}),
                     ("127.0.1.12", {"http://a/": 0, "http://b/": 0})):
        c.feed(Received(Host(ip), Frame(seen, "127.0.2.10", num("127.0.2.10", 11), 3)))
    assert sent(c) == [("net:2", Frame({"http://a/": 1, "http://b/": 0}, "127.0.2.10", num("127.0.2.10", 11), 3))]
    assert not c.dist_reduce_pool


def test_repeated_flag1_is_acknowledged_not_redone():
    c = center(peers={})
    f = Frame({"http://a/": 0}, "127.0.1.10", num("127.0.1.10", 5), 1)
    c.feed(Received(Host("127.0.1.10"), f))
    sent(c)
    c.feed(Received(Host("127.0.1.10"), f))
    assert sent(c) == [("127.0.1.10", Ack(num("127.0.1.10", 5), "duplicate"))]


def test_center_restart_resumes_and_loses_nothing():
    c = center(peers={}, resume_grace=1.0)
    c.feed(Received(Host("127.0.1.10"), Frame({"http://a/": 0}, "127.0.1.10", num("127.0.1.10", 5), 1)))
    sent(c)
    c = c.restart()
    assert num("127.0.1.10", 5) in c.core.stages.sets and c.timers == {num("127.0.1.10", 5): 1.0,
                                                               **{reissue_timer(f"127.0.1.{h}"): 300.0
                                                                  for h in (10, 11, 12)}}  # hosts away
    c.feed(Joined(Host("127.0.1.11")))  # back: asked at once
    assert [to for to, m in sent(c) if isinstance(m, Frame)] == ["127.0.1.11"]
    c.fire(num("127.0.1.10", 5))  # 127.0.1.12 never came back: no longer waited for
    assert "127.0.1.12" not in c.core.stages.sets[num("127.0.1.10", 5)].awaiting
    c.feed(Received(Host("127.0.1.11"), Frame({"http://a/": 0}, "127.0.1.10", num("127.0.1.10", 5), 3)))
    assert c.admitted == {"http://a/"}


def test_sets_done_with_their_lan_stage_go_on_to_the_peers_as_one():
    """R4 (PROTOCOL.md §10), Nagle's rule: while a set of ours is out with the peers,
    the LAN's next sets are gathered, with no timer; once it is back they go on as one
    set under the lowest of their numbers, whose claims cover all their URLs, and every
    number gathered is concluded with it."""
    c = center(peers={2: "127.0.2.0/24"}, local_lookup="center", routing="broadcast")
    c.feed(Joined(Peer(2)))
    first = Frame({"http://a/1": 0}, "127.0.1.10", 9 << 32 | 1 << 16 | 10, 1)
    c.feed(Received(Host("127.0.1.10"), first))
    assert [m.number for to, m in sent(c) if isinstance(m, Frame)] == [first.number]  # nothing out: at once
    second = Frame({"http://b/1": 0, "http://b/2": 0}, "127.0.1.11", 7 << 32 | 1 << 16 | 11, 1)
    third = Frame({"http://c/1": 0}, "127.0.1.10", 8 << 32 | 1 << 16 | 10, 1)
    for f in (second, third):
        c.feed(Received(Host(f.IP), f))
    assert not [m for to, m in sent(c) if isinstance(m, Frame)] and c.timers == {first.number: 2.0}  # no linger
    assert c.core.claims.by_url["http://c/1"] == third.number
    c.feed(Received(Peer(2), first.with_flag(3)))  # the set out is answered: nothing of ours is out
    assert "http://a/1" in c.admitted
    (to, out), = [(to, m) for to, m in sent(c) if isinstance(m, Frame)]
    assert (to, out.number, out.flag, set(out.URL_set)) == ("net:2", second.number, 2, {"http://b/1", "http://b/2", "http://c/1"})
    assert {c.core.claims.by_url[u] for u in out.URL_set} == {second.number}
    assert set(c.dist_reduce_pool) == {second.number} and not c.local_reduce_pool
    c = c.restart()  # a crash now: the gathered set is stored whole, claims rebuilt from it
    assert c.core.claims.by_url["http://c/1"] == second.number
    c.feed(Joined(Peer(2)))
    sent(c)
    c.feed(Received(Peer(2), out.with_flag(3)))
    assert {"http://b/1", "http://b/2", "http://c/1"} <= c.admitted
    assert {second.number, third.number} <= c.concluded
    c.feed(Received(Host(third.IP), third))  # re-sent (its ack lost): known, not redone
    assert sent(c) == [(third.IP, Ack(third.number, "duplicate"))]


def test_a_gathered_set_stays_within_gather_max():
    """What is held goes on first when the next set would take it past gather_max: a
    gathered set must fit the peers' max_urls (hosts' sets may be up to that size)."""
    c = center(peers={2: "127.0.2.0/24"}, local_lookup="center", gather_max=3, routing="broadcast")
    c.feed(Joined(Peer(2)))
    frames = [Frame({f"http://s{i}/a": 0, f"http://s{i}/b": 0}, "127.0.1.10", (i + 1) << 32 | 1 << 16 | 10, 1)
              for i in range(3)]
    for f in frames:
        c.feed(Received(Host(f.IP), f))
    out = [m for to, m in sent(c) if isinstance(m, Frame)]
    assert [(m.number, len(m.URL_set)) for m in out] == [(frames[0].number, 2), (frames[1].number, 2)]
    assert list(c.core.stages.gathering) == [frames[2].number]


def test_gathering_frees_room_for_every_frame_held_back():
    """R4 with back-pressure: sets gathered into one leave room under max_in_flight, and
    every held-back frame that now fits goes on (before, one per admitted set: at 5x5,
    10,000 pages, the centers then took one set per round trip and the crawl stalled)."""
    c = center(peers={2: "127.0.2.0/24"}, local_lookup="center", max_in_flight=4, routing="broadcast")
    c.feed(Joined(Peer(2)))
    frames = [Frame({f"http://s{i}/p": 0}, "127.0.1.10", (i + 1) << 32 | 1 << 16 | 10, 1) for i in range(7)]
    for f in frames:
        c.feed(Received(Host(f.IP), f))
    acked = {m.number for to, m in sent(c) if isinstance(m, Ack)}
    assert acked == {f.number for f in frames[:4]}  # one out, three gathering; three held back
    c.feed(Received(Peer(2), frames[0].with_flag(3)))  # admitted; the three go on as one: room for three
    assert {m.number for to, m in sent(c) if isinstance(m, Ack)} == {f.number for f in frames[4:]}
    assert not c.core.stages.waiting and list(c.core.stages.gathering) == [f.number for f in frames[4:]]


def admit_one_set_of_30_sites(c) -> dict:
    """Set num("127.0.1.10", 5) from .10 with 30 sites, answered by .11 and .12: admitted, so assigned by
    site to the three hosts. Returns the Task sent to each host."""
    batch = {f"http://site{i}.example/p": 0 for i in range(30)}
    c.feed(Received(Host("127.0.1.10"), Frame(batch, "127.0.1.10", num("127.0.1.10", 5), 1)))
    for ip in ("127.0.1.11", "127.0.1.12"):
        c.feed(Received(Host(ip), Frame(dict(batch), "127.0.1.10", num("127.0.1.10", 5), 3)))
    return {to: m for to, m in sent(c) if isinstance(m, Task)}


def test_tasks_go_by_site_and_wait_for_a_host_that_leaves_until_it_hands_them_back():
    c = center(peers={})
    tasks = admit_one_set_of_30_sites(c)
    assert sum(len(t.URLs) for t in tasks.values()) == 30 and len(tasks) == 3
    c.feed(Received(Host("127.0.1.11"), Ack(num("127.0.1.10", 5), "stored")))
    # .12 leaves (missed heartbeats, a closed connection): its task may be in its socket
    # or its task_pool already, so nobody else gets it (a frozen host crawled
    # what had been given to another meanwhile); it is sent again when .12 is back.
    c.feed(Left(Host("127.0.1.12")))
    assert not [m for _, m in sent(c) if isinstance(m, Task)]
    assert list(c.task_URL[f"{num('127.0.1.10', 5)}:127.0.1.12"]) == list(tasks["127.0.1.12"].URLs)
    c.feed(Joined(Host("127.0.1.12")))
    again = [(to, m) for to, m in sent(c) if isinstance(m, Task)]
    assert [(to, set(m.URLs)) for to, m in again if to == "127.0.1.12"] == [("127.0.1.12", set(tasks["127.0.1.12"].URLs))]
    # Handed back (a host leaving for good), they go to the live hosts.
    c.feed(Received(Host("127.0.1.12"), Task(9, tasks["127.0.1.12"].URLs)))
    moved = [(to, m) for to, m in sent(c) if isinstance(m, Task)]
    assert {to for to, _ in moved} <= {"127.0.1.10", "127.0.1.11"}
    assert set(tasks["127.0.1.12"].URLs) <= {u for _, m in moved for u in m.URLs}
    assert not any(k.endswith("127.0.1.12") for k in c.task_URL)


def test_under_admit_a_host_that_leaves_has_its_tasks_reassigned():
    c = center(peers={}, partition_policy="admit")  # under "wait" they stay (tests around)
    tasks = admit_one_set_of_30_sites(c)
    assert sum(len(t.URLs) for t in tasks.values()) == 30 and len(tasks) == 3
    c.feed(Received(Host("127.0.1.11"), Ack(num("127.0.1.10", 5), "stored")))
    c.feed(Left(Host("127.0.1.12")))
    moved = [(to, m) for to, m in sent(c) if isinstance(m, Task)]
    # .12's URLs go to the live hosts (joining .10's unacknowledged task, sent again whole).
    assert {to for to, _ in moved} <= {"127.0.1.10", "127.0.1.11"}
    assert set(tasks["127.0.1.12"].URLs) <= {u for _, m in moved for u in m.URLs}
    assert not any(k.endswith("127.0.1.12") for k in c.task_URL)


def test_under_wait_a_host_that_disconnects_keeps_its_unacknowledged_tasks():
    """Found by the lossy-lan link scenario (tests/test_relay.py): a task whose ack is
    lost with the connection is in the host's task_pool already; it must not go to
    another host too. It stays assigned and is sent again when the host is back."""
    c = center(peers={})
    tasks = admit_one_set_of_30_sites(c)
    c.feed(Left(Host("127.0.1.12")))
    assert [m for _, m in sent(c) if isinstance(m, Task)] == []
    assert c.core.counters.get("tasks_reassigned") == 0
    c.feed(Joined(Host("127.0.1.12")))
    assert [(to, m) for to, m in sent(c) if isinstance(m, Task)] == [("127.0.1.12", tasks["127.0.1.12"])]
    c.feed(Received(Host("127.0.1.12"), Ack(num("127.0.1.10", 5), "stored")))
    assert not any(k.endswith("127.0.1.12") for k in c.task_URL)


def test_host_drops_its_own_request_and_answers_others():
    h = MemoryHost.make(ip="127.0.1.11", network=1, host_id=11, mode="exact")
    h.finish_URL.add("http://a/")
    h.task_pool.append("http://b/")
    h.feed(hp.FromCenter(Frame({"http://a/": 0}, "127.0.1.11", 3, 2)))
    assert h.outbox == [] and h.core.counters.get("own_requests_dropped") == 1
    h.feed(hp.FromCenter(Frame({"http://a/": 0, "http://b/": 0, "http://c/": 0}, "127.0.1.10", 4, 2)))
    (answer,) = [decode(d) for d in h.take_outbox()]
    assert answer == Frame({"http://a/": 1, "http://b/": 1, "http://c/": 0}, "127.0.1.10", 4, 3)


def test_host_keeps_urls_until_acknowledged_and_resends_after_reconnect():
    h = MemoryHost.make(ip="127.0.1.11", network=1, host_id=11, set_size=2)
    h.push(urls(1, 2, 3))
    h.walk()
    frames = [decode(d) for d in h.take_outbox()]
    assert [len(f.URL_set) for f in frames] == [2, 1] and len(h.URL_pool) == 3
    h.feed(hp.FromCenter(Ack(frames[0].number, "stored")))
    assert len(h.URL_pool) == 1
    h.feed(hp.Connected())
    assert [decode(d) for d in h.take_outbox()] == [frames[1]]


def test_a_host_sends_at_once_when_nothing_is_in_flight_and_otherwise_gathers_until_the_ack():
    """Nagle's rule (group commit), with no timer: what the walker hands the core goes at
    once while no message of this host's awaits the center's ack, so an idle host
    admits in one round trip; while one does, it gathers until the ack comes back or
    it fills a set (the size cap), so a busy one sends fuller sets."""
    h = MemoryHost.make(ip="127.0.1.11", network=1, host_id=11, set_size=4)
    h.push(urls(1, 2))
    h.walk()
    (first,) = [decode(d) for d in h.take_outbox()]
    assert set(first.URL_set) == set(urls(1, 2))  # nothing in flight: at once
    for batch in (urls(3), urls(4, 5)):
        h.push(batch)
        h.walk()
        assert h.take_outbox() == []  # the first awaits its ack: gathered
    assert [u for _, u in h.core.held] == urls(3, 4, 5)
    h.feed(hp.FromCenter(Ack(first.number, "stored")))
    (second,) = [decode(d) for d in h.take_outbox()]
    assert set(second.URL_set) == set(urls(3, 4, 5)) and not h.core.held  # the ack sends what gathered
    h.push(urls(6, 7, 8, 9))
    h.walk()
    (third,) = [decode(d) for d in h.take_outbox()]
    assert set(third.URL_set) == set(urls(6, 7, 8, 9))  # a full set goes while another is in flight
    h.feed(hp.FromCenter(Ack(second.number, "stored")))
    h.feed(hp.FromCenter(Ack(third.number, "stored")))
    assert not h.core.unacked and not h.core.in_flight and not h.URL_pool


def test_a_set_the_center_refused_does_not_hold_the_next_one_back():
    """A refused set is kept for the next connection, not awaited on this one: a part-full
    set behind it goes (waiting for an ack that will not come would hold it for ever)."""
    h = MemoryHost.make(ip="127.0.1.11", network=1, host_id=11, set_size=4)
    h.push(urls(1))
    h.walk()
    (first,) = [decode(d) for d in h.take_outbox()]
    h.push(urls(2))
    h.walk()
    assert h.take_outbox() == []
    h.feed(hp.FromCenter(Ack(first.number, "rejected", "too-many-held")))
    (second,) = [decode(d) for d in h.take_outbox()]
    assert set(second.URL_set) == set(urls(2)) and first.number in h.core.unacked
    h.feed(hp.Connected())  # both go again, and are awaited again
    assert {decode(d).number for d in h.take_outbox()} == {first.number, second.number}
    h.push(urls(3))
    h.walk()
    assert h.take_outbox() == [] and h.core.in_flight


def test_a_restarted_host_holds_what_it_finds_until_its_unacknowledged_sets_are_acknowledged():
    """After a restart the sets stored unacknowledged are in flight (they go on
    connecting): what the host finds meanwhile gathers behind them."""
    h = MemoryHost.make(ip="127.0.1.11", network=1, host_id=11, set_size=4)
    h.push(urls(1))
    h.walk()
    (first,) = [decode(d) for d in h.take_outbox()]
    fresh = MemoryHost.make(ip="127.0.1.11", network=1, host_id=11, set_size=4)
    fresh.sequence = h.sequence
    fresh.feed(hp.Resume(dict(h.unacked)))
    fresh.push(urls(2))
    fresh.walk()
    assert fresh.take_outbox() == [] and [u for _, u in fresh.core.held] == urls(2)
    fresh.feed(hp.Connected())
    assert [decode(d) for d in fresh.take_outbox()] == [first]
    fresh.feed(hp.FromCenter(Ack(first.number, "stored")))
    (second,) = [decode(d) for d in fresh.take_outbox()]
    assert set(second.URL_set) == set(urls(2))


def test_back_pressure_holds_frames_unacknowledged_until_a_set_concludes():
    c = center(peers={}, max_in_flight=1)
    first = Frame({"http://a/": 0}, "127.0.1.10", num("127.0.1.10", 5), 1)
    second = Frame({"http://b/": 0}, "127.0.1.11", num("127.0.1.11", 6), 1)
    c.feed(Received(Host("127.0.1.10"), first))
    sent(c)
    c.feed(Received(Host("127.0.1.11"), second))
    assert sent(c) == [] and num("127.0.1.11", 6) in c.core.stages.waiting  # held: no ack, so host .11 keeps it
    for ip in ("127.0.1.11", "127.0.1.12"):
        c.feed(Received(Host(ip), Frame({"http://a/": 0}, "127.0.1.10", num("127.0.1.10", 5), 3)))
    out = sent(c)
    assert ("127.0.1.11", Ack(num("127.0.1.11", 6), "stored")) in out  # the first concluded; the held one goes on
    assert num("127.0.1.11", 6) in c.core.stages.sets and not c.core.stages.waiting


def test_urls_held_by_other_networks_sets_are_a_bounded_memory_cache():
    """Exact mode drops early what another network's set holds, from a bounded cache
    (never Redis, never needed for exactness): the oldest entries go first."""
    c = center(held_elsewhere_max=2, routing="broadcast")
    c.feed(Joined(Peer(2)))
    for i, number in enumerate((num("127.0.2.10", 11), num("127.0.2.10", 12), num("127.0.2.10", 13))):
        f = Frame({f"http://e.example/{i}": 0}, "127.0.2.10", number, 2)
        c.feed(Received(Peer(2), f))
        for ip in ("127.0.1.10", "127.0.1.11", "127.0.1.12"):
            c.feed(Received(Host(ip), f.with_flag(3)))
    assert c.core.claims.held_elsewhere == {"http://e.example/1": num("127.0.2.10", 12), "http://e.example/2": num("127.0.2.10", 13)}
    sent(c)
    c.feed(Received(Host("127.0.1.10"), Frame({"http://e.example/0": 0, "http://e.example/2": 0},
                                                   "127.0.1.10", num("127.0.1.10", 20), 1)))
    asked = [m for _, m in sent(c) if isinstance(m, Frame)]
    assert asked and all(m.URL_set == {"http://e.example/0": 0} for m in asked)
