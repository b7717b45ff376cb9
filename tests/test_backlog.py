"""The center's running counts (center_host/backlog.py): what its back-pressure reads on
every frame is counted as sets enter and leave their stages, not by a scan. Every test
that drives a core through tests/conformance/memory.py, and every simulator run, checks
the counts against a scan after each event; these show that the check catches a drift."""

import pytest

from center_host.events import Host, Left, Peer, Received
from dedupnet.codec.messages import Ack, Frame

from .home_routing import center, num, sent, urls_homed


def test_counts_follow_the_sets_through_routing_and_acks():
    c = center(routed_frames_out=1)  # the second frame carries two sets
    m = c.core.homes.map
    for seq in range(1, 4):
        urls = urls_homed(m, 1, 1, f"s{seq}") + urls_homed(m, 2, 2, f"s{seq}") + urls_homed(m, 3, 1, f"s{seq}")
        c.feed(Received(Host("127.0.1.10"), Frame(dict.fromkeys(urls, 0), "127.0.1.10", num(1, 10, seq), 1)))
    backlog = c.core.stages.backlog
    assert backlog.routed == 9 == sum(c.core.stages.routed_waiting().values()) and c.core.stages.own_in_flight() == 0
    c.feed(Received(Peer(2), Ack(num(1, 10, 1), "stored")))
    c.feed(Left(Peer(3)))
    assert backlog.routed == 7
    (frame,) = [msg for to, msg in sent(c) if to == "net:2" and msg.number == num(1, 10, 2)]
    c.feed(Received(Peer(2), Ack(frame.number, "stored")))
    assert backlog.routed == 3 and len(c.core.stages.sets) == 3


def test_a_drifting_count_fails_the_check():
    c = center()
    m = c.core.homes.map
    c.feed(Received(Host("127.0.1.10"), Frame(dict.fromkeys(urls_homed(m, 2, 2), 0), "127.0.1.10", num(1, 10, 1), 1)))
    stages = c.core.stages
    stages.check_backlog()
    stages.backlog.routed += 1
    with pytest.raises(AssertionError, match="drifted"):
        stages.check_backlog()
    stages.backlog.routed -= 1
    stages.sets[num(1, 10, 1)].routes[2].pop()  # a route changed behind the counts' back
    with pytest.raises(AssertionError, match="drifted"):
        stages.check_backlog()


def test_frames_held_are_counted_per_host_and_released_when_they_go_on():
    c = center(peers=(), hosts=("10", "11", "12"), max_in_flight=1, local_lookup="lan")
    for host in ("10", "11"):
        ip = f"127.0.1.{host}"
        c.feed(Received(Host(ip), Frame({f"http://{host}.example/": 0}, ip, num(1, int(host), 1), 1)))
    ip = "127.0.1.11"
    c.feed(Received(Host(ip), Frame({"http://11.example/2": 0}, ip, num(1, 11, 2), 1)))
    assert c.core.stages.backlog.held == {Host("127.0.1.11"): 2} and c.core.stages.own_in_flight() == 1
    first = num(1, 10, 1)
    for ip in ("127.0.1.11", "127.0.1.12"):
        c.feed(Received(Host(ip), Frame({"http://10.example/": 0}, "127.0.1.10", first, 3)))
    assert c.core.stages.backlog.held == {Host("127.0.1.11"): 1}
