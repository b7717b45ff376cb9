"""One home per site (docs/PROTOCOL.md §11): the map, and the center core routing by it."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from center_host.events import Host, Joined, Left, Peer, Received
from center_host.config import CenterConfig
from dedupnet.codec.homes import HomeMap, parse_weights
from dedupnet.codec.messages import Ack, Frame, Task

from .conformance.memnet import MemNet
from .home_routing import SITES, center, num, sent, urls_homed



def shares(m: HomeMap) -> Counter:
    return Counter(m.home_of_site(s) for s in SITES)


@given(st.dictionaries(st.integers(1, 65535), st.floats(0.1, 10), min_size=1, max_size=12))
@settings(max_examples=50, deadline=None)
def test_the_same_configuration_gives_the_same_home_everywhere(weights):
    a, b = HomeMap(weights), HomeMap(dict(reversed(list(weights.items()))))
    assert a.describe() == b.describe()
    assert all(a.home_of_site(s) == b.home_of_site(s) for s in SITES[:300])
    assert all(a.home_of_site(s) in weights for s in SITES[:300])


@pytest.mark.parametrize("networks", [2, 3, 5, 8, 16])
def test_adding_a_network_moves_about_its_share_and_only_to_it(networks):
    before = HomeMap({n: 1.0 for n in range(1, networks + 1)})
    after = HomeMap({n: 1.0 for n in range(1, networks + 2)})
    moved = [s for s in SITES if before.home_of_site(s) != after.home_of_site(s)]
    assert all(after.home_of_site(s) == networks + 1 for s in moved)  # nothing moves between old networks
    expected = len(SITES) / (networks + 1)
    assert abs(len(moved) - expected) < 4 * expected**0.5  # 4 sigma of a binomial count
    # Removing it again puts every site back where it was.
    assert all(before.home_of_site(s) == HomeMap(before.weights).home_of_site(s) for s in moved)


@pytest.mark.parametrize("weights", [{1: 1, 2: 1, 3: 2}, {1: 0.5, 2: 3}, {1: 1, 2: 1, 3: 1, 4: 5}])
def test_weights_shift_shares_as_configured(weights):
    got = shares(HomeMap(weights))
    total = sum(weights.values())
    for network, weight in weights.items():
        expected = len(SITES) * weight / total
        assert abs(got[network] - expected) < 5 * expected**0.5, (network, got)


def test_weights_are_parsed_and_checked():
    assert parse_weights(["3=2", "4=0.5"]) == {3: 2.0, 4: 0.5}
    for bad in (["3"], ["x=1"], ["3=y"]):
        with pytest.raises(ValueError, match="NETWORK=WEIGHT"):
            parse_weights(bad)
    with pytest.raises(ValueError, match="positive"):
        HomeMap({1: 0})
    with pytest.raises(ValueError, match="neither this one nor a peer"):
        CenterConfig(network=1, lan="127.0.1.0/24", peers={2: "127.0.2.0/24"}, weights={9: 1})


# -- the core -------------------------------------------------------------------------
def test_urls_homed_here_are_admitted_with_no_wan_message_others_go_to_their_home_alone():
    c = center()
    m = c.core.homes.map
    here, two, three = urls_homed(m, 1, 5), urls_homed(m, 2, 4), urls_homed(m, 3, 3)
    n = num(1, 10, 1)
    c.feed(Received(Host("127.0.1.10"), Frame(dict.fromkeys(here + two + three, 0), "127.0.1.10", n, 1)))
    out = sent(c)
    assert c.admitted == set(here)  # decided here at once
    to_peers = {to: msg for to, msg in out if to.startswith("net:")}
    assert set(to_peers) == {"net:2", "net:3"}  # one frame to each home, none to anyone else
    assert set(to_peers["net:2"].URL_set) == set(two) and to_peers["net:2"].flag == 1
    assert set(to_peers["net:3"].URL_set) == set(three)
    assert c.core.stages.routed_waiting() == {2: 4, 3: 3} and n in c.dist_reduce_pool
    c.feed(Received(Peer(2), Ack(n, "stored")))
    assert c.core.stages.routed_waiting() == {3: 3}
    c.feed(Received(Peer(3), Ack(n, "duplicate")))  # a repeat is as good: held there
    assert not c.core.stages.sets and not c.dist_reduce_pool and n in c.concluded and not c.core.claims.by_url


def test_one_frame_at_a_time_goes_to_a_home_carrying_every_set_that_waits_for_it():
    """With one frame out per home (``routed_frames_out = 1``): while it is out, the next
    sets' URLs for it wait; its ack sends them all in one frame under the lowest number,
    and they all leave at its ack. A reconnection sends the frame out again, the same,
    and nothing else."""
    c = center(routed_frames_out=1)
    m = c.core.homes.map
    frames = {seq: dict.fromkeys(urls_homed(m, 1, 1, f"s{seq}") + urls_homed(m, 2, 2, f"s{seq}"), 0)
              for seq in range(1, 5)}
    for seq, urls in frames.items():
        c.feed(Received(Host("127.0.1.10"), Frame(urls, "127.0.1.10", num(1, 10, seq), 1)))
    first = [msg for to, msg in sent(c) if to == "net:2"]
    assert [(f.number, len(f.URL_set)) for f in first] == [(num(1, 10, 1), 2)]
    c.feed(Left(Peer(2)))  # the connection is reset: the frame or its ack is lost
    c.feed(Joined(Peer(2)))
    assert [msg for to, msg in sent(c) if to == "net:2"] == first
    c.feed(Received(Peer(2), Ack(num(1, 10, 3), "stored")))  # not the frame out: ignored
    assert c.core.stages.routed_waiting() == {2: 8}
    c.feed(Received(Peer(2), Ack(num(1, 10, 1), "stored")))
    (second,) = [msg for to, msg in sent(c) if to == "net:2"]
    assert second.number == num(1, 10, 2) and second.IP == "127.0.1.10" and len(second.URL_set) == 6
    assert set(c.core.stages.sets) == {num(1, 10, seq) for seq in (2, 3, 4)}
    c.feed(Received(Peer(2), Ack(second.number, "stored")))
    assert not c.core.stages.sets and not c.dist_reduce_pool and not sent(c)
    assert {num(1, 10, seq) for seq in frames} <= set(c.concluded)


def test_a_few_frames_are_out_with_a_home_at_once_and_each_ack_lets_the_next_go():
    """``routed_frames_out`` frames (each up to ``gather_max`` URLs) go to a home at once;
    the sets after them wait, and an ack, in whatever order, takes its frame's URLs out
    and sends the next. A reconnection sends every frame out again, the same, and
    nothing else; an ack of no frame out is ignored."""
    c = center(routed_frames_out=3, gather_max=2)
    m = c.core.homes.map
    for seq in range(1, 7):
        urls = urls_homed(m, 2, 2, f"s{seq}")
        c.feed(Received(Host("127.0.1.10"), Frame(dict.fromkeys(urls, 0), "127.0.1.10", num(1, 10, seq), 1)))
    first = [msg for to, msg in sent(c) if to == "net:2"]
    assert [(f.number, len(f.URL_set)) for f in first] == [(num(1, 10, seq), 2) for seq in (1, 2, 3)]
    assert c.core.stages.routed_waiting() == {2: 12}
    c.feed(Left(Peer(2)))
    c.feed(Joined(Peer(2)))
    assert [msg for to, msg in sent(c) if to == "net:2"] == first
    c.feed(Received(Peer(2), Ack(num(1, 10, 5), "stored")))  # not out yet: ignored
    assert c.core.stages.routed_waiting() == {2: 12} and not sent(c)
    c.feed(Received(Peer(2), Ack(num(1, 10, 2), "stored")))
    assert [(f.number, set(f.URL_set)) for to, f in sent(c) if to == "net:2"] == [
        (num(1, 10, 4), set(urls_homed(m, 2, 2, "s4")))]
    assert num(1, 10, 2) not in c.core.stages.sets and c.core.stages.routed_waiting() == {2: 10}
    for seq in (1, 3, 4):
        c.feed(Received(Peer(2), Ack(num(1, 10, seq), "stored")))
    rest = [msg for to, msg in sent(c) if to == "net:2"]
    assert sorted(f.number for f in rest) == [num(1, 10, 5), num(1, 10, 6)]
    for f in rest:
        c.feed(Received(Peer(2), Ack(f.number, "stored")))
    assert not c.core.stages.sets and c.core.stages.routed_waiting() == {}
    assert {num(1, 10, seq) for seq in range(1, 7)} <= set(c.concluded)


def test_a_part_full_frame_waits_while_one_is_out_and_a_full_one_does_not():
    """Nagle's rule within the window: with nothing out a set's URLs go at once; while a
    frame is out the next sets gather, and they go as soon as they fill a frame
    (``gather_max``) or, part-full, once no frame is out."""
    c = center(routed_frames_out=3, gather_max=4)
    m = c.core.homes.map

    def found(seq, n):
        c.feed(Received(Host("127.0.1.10"), Frame(dict.fromkeys(urls_homed(m, 2, n, f"s{seq}"), 0), "127.0.1.10",
                                                  num(1, 10, seq), 1)))
        return [(f.number, len(f.URL_set)) for to, f in sent(c) if to == "net:2"]

    assert found(1, 1) == [(num(1, 10, 1), 1)]  # idle: at once
    assert found(2, 1) == []  # part-full while one is out: waits
    assert found(3, 3) == [(num(1, 10, 2), 4)]  # full: goes alongside
    assert found(4, 1) == []
    c.feed(Received(Peer(2), Ack(num(1, 10, 1), "stored")))
    assert not sent(c)  # a frame is still out
    c.feed(Received(Peer(2), Ack(num(1, 10, 2), "stored")))
    assert [(f.number, len(f.URL_set)) for to, f in sent(c) if to == "net:2"] == [(num(1, 10, 4), 1)]


def test_the_home_decides_a_peers_urls_against_its_record_and_assigns_them_in_its_lan():
    c = center(network=2, peers=(1, 3), hosts=("10",))
    m = c.core.homes.map
    mine = urls_homed(m, 2, 4)
    c.admitted.add(mine[0])  # admitted here before (found in this network)
    n = num(1, 10, 7)
    c.feed(Received(Peer(1), Frame(dict.fromkeys(mine, 0), "127.0.1.10", n, 1)))
    out = sent(c)
    assert ("net:1", Ack(n, "stored")) in out
    assert c.admitted == set(mine)
    (task,) = [msg for _, msg in out if isinstance(msg, Task)]
    assert set(task.URLs) == set(mine[1:])
    c.feed(Received(Peer(1), Frame(dict.fromkeys(mine, 0), "127.0.1.10", n, 1)))  # the ack was lost
    assert sent(c) == [("net:1", Ack(n, "duplicate"))]


@pytest.mark.parametrize("frame, reason", [
    (Frame({"http://a.example/": 0}, "127.0.3.10", num(1, 10, 1), 1), "not-a-peer"),  # IP of another network
    (Frame({"http://a.example/": 0}, "127.0.1.10", num(3, 10, 1), 1), "number-not-sender"),
    (Frame({"http://a.example/": 0}, "127.0.9.10", num(9, 10, 1), 1), "not-a-peer"),  # a network not configured
    (Frame({"http://a.example/": 0}, "127.0.3.10", num(3, 10, 4), 1), "not-a-peer"),  # network 3's set, passed on
])
def test_a_routed_set_must_be_the_senders_own(frame, reason):
    """A set routed here is never routed on, so a routed set is always its sender's own."""
    c = center(network=2, peers=(1, 3))
    c.feed(Received(Peer(1), frame))
    assert c.core.counters.get("rejected", reason=reason) == 1 and not c.admitted and not sent(c)


def test_a_previous_home_answers_from_what_it_admitted_not_from_what_it_routes():
    """Network 1 (the previous home) routes u to network 2 (its new home) in a set of
    its own while network 2 asks it about u: it must not answer "seen" for a URL it will
    not admit — network 2 would drop it, and then drop network 1's copy too, which its
    checking set claims."""
    old = {1: 1.0, 2: 1.0}
    c = center(network=1, peers=(2,), weights={1: 0.0}, previous_weights=(old,))
    url = next(u for u in urls_homed(HomeMap(old), 1, 50))  # homed at 1 before, at 2 now
    mine = num(1, 10, 1)
    c.feed(Received(Host("127.0.1.10"), Frame({url: 0}, "127.0.1.10", mine, 1)))
    assert [(to, f.URL_set) for to, f in sent(c) if to == "net:2"] == [("net:2", {url: 0})]
    asked = num(2, 10, 9)  # network 2's higher-numbered set asks about the same URL
    c.feed(Received(Peer(2), Frame({url: 0}, "127.0.2.10", asked, 2)))
    assert [f.URL_set for to, f in sent(c) if to == "net:2"] == [{url: 0}]  # not admitted here: unseen


def test_a_home_that_is_down_delays_only_its_own_sites_and_gets_them_when_back():
    c = center()
    m = c.core.homes.map
    c.feed(Left(Peer(3)))
    for seq in range(1, 6):
        here, three = urls_homed(m, 1, 10, f"s{seq}"), urls_homed(m, 3, 2, f"s{seq}")
        c.feed(Received(Host("127.0.1.10"), Frame(dict.fromkeys(here + three, 0), "127.0.1.10",
                                                        num(1, 10, seq), 1)))
    assert len(c.admitted) == 50  # every URL of this network's sites: admitted during the cut
    assert c.core.stages.routed_waiting() == {3: 10} and not [to for to, _ in sent(c) if to == "net:3"]
    for number in list(c.timers):  # time passes: nothing is given up, nothing sent to the dead
        c.fire(number)
    assert c.core.stages.routed_waiting() == {3: 10} and c.core.counters.get("sets_concluded", complete="false") == 0
    c.feed(Joined(Peer(3)))
    asked = [msg for to, msg in sent(c) if to == "net:3"]
    assert len(asked) == 1 and len(asked[0].URL_set) == 10  # all it waits for, in one frame
    for f in asked:
        c.feed(Received(Peer(3), Ack(f.number, "stored")))
    assert not c.core.stages.sets and c.core.stages.routed_waiting() == {}


def test_the_urls_a_center_holds_for_other_homes_are_bounded():
    c = center(max_routed_waiting=4)
    m = c.core.homes.map
    c.feed(Left(Peer(2)))
    first = Frame(dict.fromkeys(urls_homed(m, 2, 4), 0), "127.0.1.10", num(1, 10, 1), 1)
    second = Frame(dict.fromkeys(urls_homed(m, 1, 2), 0), "127.0.1.10", num(1, 10, 2), 1)
    c.feed(Received(Host("127.0.1.10"), first))
    c.feed(Received(Host("127.0.1.10"), second))
    assert ("127.0.1.10", Ack(second.number, "stored")) not in sent(c)  # held back: not acknowledged
    c.feed(Joined(Peer(2)))
    c.feed(Received(Peer(2), Ack(first.number, "stored")))
    assert ("127.0.1.10", Ack(second.number, "stored")) in sent(c)


def test_a_restarted_center_sends_the_urls_it_holds_to_their_homes_again():
    c = center(resume_grace=1.0)
    m = c.core.homes.map
    two = urls_homed(m, 2, 3)
    n = num(1, 10, 1)
    c.feed(Received(Host("127.0.1.10"), Frame(dict.fromkeys(two, 0), "127.0.1.10", n, 1)))
    sent(c)
    c = c.restart()
    assert c.core.claims.by_url == dict.fromkeys(two, n)
    c.feed(Joined(Peer(2)))
    assert [(to, set(f.URL_set)) for to, f in sent(c)] == [("net:2", set(two))]


@pytest.mark.parametrize("seed", range(40))
def test_random_interleavings_with_partitions_admit_each_url_once_at_its_home(seed):
    net = MemNet(4, 2, mode="exact", seed=seed, early_timers=0.3, partitions=0.05)
    shared = [f"http://site{i % 23}.example/{i}" for i in range(40)]
    pushed = set()
    for i, host in enumerate(net.hosts.values()):
        found = net.rnd.sample(shared, 20) + [f"http://own{i}.example/x"]
        host.push(found)
        pushed.update(found)
    net.run()
    net.settle()
    admitted = Counter(net.admitted())
    assert set(admitted) == pushed
    assert max(admitted.values()) == 1
    homes = next(iter(net.centers.values())).core.homes.map
    for n, c in net.centers.items():  # each URL admitted by its site's home network
        assert all(homes.home_of(u) == n for u in c.admitted)


# -- real daemons ---------------------------------------------------------------------
async def test_a_network_cut_off_delays_only_its_own_sites(redis_url):
    """Network 3 is cut from both others (silent WAN links): networks 1 and 2 go on
    admitting the URLs of their own sites; network 3's wait in center 1's
    dist_reduce_pool, shown in its status, and are admitted once after the heal."""
    import random

    import trio

    from dedupnet.harness.cluster import open_cluster

    async with open_cluster(redis_url, 3, 1, set_size=20, prefix=f"home{random.random()}",
                            links={"wan:1-3", "wan:2-3"}) as system:
        for link in ("wan:1-3", "wan:2-3"):
            system.relays[link].partition()
        m = HomeMap({1: 1, 2: 1, 3: 1})  # the centers' map
        found = {n: urls_homed(m, n, 30, "cut") for n in (1, 2, 3)}
        host = system.hosts["127.0.1.10"]
        await host.store.run(host.pools.push, [u for n in (1, 2, 3) for u in found[n]])
        with trio.fail_after(30):
            while (system.centers[1].counters.get("urls_admitted") < 30
                   or system.centers[2].counters.get("urls_admitted") < 30
                   or system.centers[1].core.stages.routed_waiting() != {3: 30}):
                await trio.sleep(0.05)
        assert (await system.centers[1].status())["waiting_for_networks"] == {"net:3": 30}
        assert system.centers[3].counters.get("urls_admitted") == 0
        for link in ("wan:1-3", "wan:2-3"):
            system.relays[link].heal()
        with trio.fail_after(60):
            await system.wait_quiescent()
        tasks = {ip: [u for _, u in await h.store.run(h.pools.all_tasks)] for ip, h in system.hosts.items()}
    queued = Counter(u for urls in tasks.values() for u in urls)
    assert set(queued) == {u for urls in found.values() for u in urls} and max(queued.values()) == 1
    for n, urls in found.items():  # each admitted by its home, whose one host has it
        assert set(urls) <= set(tasks[f"127.0.{n}.10"])


async def change_the_map_mid_crawl(redis_url, previous: bool) -> tuple[Counter, set]:
    """Three networks admit URLs of 40 sites; then network 4 is added and network 2
    retired (weight 0), every center restarted with the new map (and, with ``previous``,
    the old one); then every URL is found again, with new ones, in every network."""
    import random

    import trio

    from dedupnet.harness.cluster import open_cluster

    first = [f"http://s{i}.example/{j}" for i in range(40) for j in range(3)]
    then = first + [f"http://s{i}.example/new{j}" for i in range(40) for j in range(2)]
    async with open_cluster(redis_url, 3, 1, set_size=25, prefix=f"remap{random.random()}") as system:
        for n, host in enumerate(system.hosts.values()):
            await host.store.run(host.pools.push, first[n::3])
        with trio.fail_after(30):
            await system.wait_quiescent()
        system.timing["weights"] = {2: 0.0}  # network 2 is retired: home to no site
        if previous:
            system.timing["previous_weights"] = ({1: 1.0, 2: 1.0, 3: 1.0},)
        await system.start_center(4, 4)
        for n in (1, 2, 3):
            await system.restart_center(n)
        await system.start_host(4, 0)
        with trio.fail_after(30):
            await system.wait_connected()
            hosts = list(system.hosts.values())
            for n, host in enumerate(hosts):
                await host.store.run(host.pools.push, then[n::2] if n % 2 else then[::-1][n::3])
            await system.wait_quiescent()
        queued = Counter([u for h in hosts for _, u in await h.store.run(h.pools.all_tasks)])
        pushed = set(first) | {u for n in range(len(hosts)) for u in (then[n::2] if n % 2 else then[::-1][n::3])}
        return queued, pushed


async def test_a_network_added_and_one_retired_mid_crawl_admits_each_url_once(redis_url):
    queued, pushed = await change_the_map_mid_crawl(redis_url, previous=True)
    assert set(queued) == pushed  # nothing lost
    assert max(queued.values()) == 1, [u for u, k in queued.items() if k > 1][:5]  # nothing admitted twice


async def test_without_the_previous_map_sites_that_moved_are_admitted_again(redis_url):
    """What ``previous_weights`` is for: forgetting the earlier map re-admits the URLs
    of the sites that moved (so the test above can fail)."""
    queued, pushed = await change_the_map_mid_crawl(redis_url, previous=False)
    assert set(queued) == pushed and max(queued.values()) == 2


def test_a_url_its_home_has_taken_is_dropped_at_once_when_found_again():
    c = center()
    two = urls_homed(c.core.homes.map, 2, 3)
    first = num(1, 10, 1)
    c.feed(Received(Host("127.0.1.10"), Frame(dict.fromkeys(two, 0), "127.0.1.10", first, 1)))
    c.feed(Received(Peer(2), Ack(first, "stored")))
    sent(c)
    c.feed(Received(Host("127.0.1.11"), Frame(dict.fromkeys(two, 0), "127.0.1.11", num(1, 11, 1), 1)))
    assert not [to for to, _ in sent(c) if to == "net:2"]  # no second trip to the home
    assert c.core.counters.get("urls_dropped", stage="center-record") == 3
