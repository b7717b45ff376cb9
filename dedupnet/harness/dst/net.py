"""The network between the simulated daemons: one TCP connection per pair (a host and
its center; two centers), as the daemons keep them.

What TCP allows, and only that: each direction delivers in order, without loss or
duplication, after a per-link latency; a connection that is reset (or closed by a
heartbeat deadline) loses what was in flight and the two ends learn of it when a
packet can reach them; a direction that is cut (a partition, a half-open link) holds
what is sent (TCP retransmits it) and delivers it when the cut heals, if the
connection still stands. A connection is made only when both directions pass.
Duplicates and losses above TCP are the protocol's own re-sends and the resets.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable

from .clock import Scheduler


class Pair:
    """The connection between ``a`` (the dialling end) and ``b``."""

    __slots__ = ("a", "b", "epoch", "up", "base", "last", "held", "since", "wan")

    def __init__(self, a: str, b: str, base: float, wan: bool):
        self.a, self.b, self.base, self.wan = a, b, base, wan
        self.epoch = 0
        self.up = False
        self.last = {a: 0.0, b: 0.0}  # by sender: when its last message arrives (FIFO)
        self.held: dict[str, list] = {a: [], b: []}  # by sender: sent into a cut direction
        self.since = 0.0

    def other(self, end: str) -> str:
        return self.b if end == self.a else self.a


class Network:
    """``deliver(to, frm, epoch, data)`` and ``closed(end, other, epoch)`` are the
    endpoints' callbacks (set by the runner)."""

    def __init__(self, sched: Scheduler, deliver: Callable, closed: Callable):
        self.sched = sched
        self.deliver_cb, self.closed_cb = deliver, closed
        self.pairs: dict[frozenset, Pair] = {}
        self.cut: set[tuple[str, str]] = set()  # directions (from, to) that pass nothing
        self.slow: dict[frozenset, float] = {}  # latency factor of a slowed link
        self.in_flight = 0
        self.notices: list[tuple[Pair, str, int]] = []  # close notices waiting for a path
        self.messages: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()

    def pair(self, a: str, b: str, *, wan: bool) -> Pair:
        key = frozenset((a, b))
        p = self.pairs.get(key)
        if p is None:
            rng = self.sched.rng
            base = (0.005 + 0.095 * rng.random()) if wan else (0.0002 + 0.0008 * rng.random())
            p = self.pairs[key] = Pair(a, b, base, wan)
        return p

    def passes(self, frm: str, to: str) -> bool:
        return (frm, to) not in self.cut

    def both_ways(self, p: Pair) -> bool:
        return self.passes(p.a, p.b) and self.passes(p.b, p.a)

    def latency(self, p: Pair) -> float:
        rng = self.sched.rng
        d = p.base * (0.8 + 0.4 * rng.random())
        if rng.random() < 0.02:  # a tail: a retransmission, a queue somewhere
            d += rng.expovariate(1 / (p.base * 5))
        return d * self.slow.get(frozenset((p.a, p.b)), 1.0)

    # -- connections -------------------------------------------------------------------
    def connect(self, p: Pair) -> int | None:
        """A new connection if both directions pass; returns its epoch."""
        if not self.both_ways(p):
            return None
        p.epoch += 1
        p.up, p.since = True, self.sched.now
        p.last = {p.a: self.sched.now, p.b: self.sched.now}
        p.held = {p.a: [], p.b: []}
        return p.epoch

    def close(self, p: Pair, by: str | None) -> None:
        """Reset or close the connection; ``by`` (None: both, e.g. a machine that came
        back) knows at once, the other end when a packet can reach it."""
        if not p.up:
            return
        p.up = False
        epoch = p.epoch
        for sender in (p.a, p.b):
            self.in_flight -= len(p.held[sender])  # the scheduled ones count down on arrival
            p.held[sender] = []
        for end in (p.a, p.b):
            if end == by:
                self.sched.at(self.sched.now, self.closed_cb, end, p.other(end), epoch)
            else:
                self._notice(p, end, epoch)

    def _notice(self, p: Pair, end: str, epoch: int) -> None:
        if self.passes(p.other(end), end):
            self.sched.after(self.latency(p), self.closed_cb, end, p.other(end), epoch)
        else:
            self.notices.append((p, end, epoch))

    # -- data --------------------------------------------------------------------------
    def send(self, p: Pair, frm: str, epoch: int, data: bytes, kind: str) -> bool:
        if not p.up or p.epoch != epoch:
            return False
        self.messages[kind] += 1
        self.bytes[kind] += len(data)
        self.in_flight += 1
        if not self.passes(frm, p.other(frm)):
            p.held[frm].append(data)
            return True
        self._schedule(p, frm, data)
        return True

    def _schedule(self, p: Pair, frm: str, data: bytes) -> None:
        t = max(self.sched.now + self.latency(p), p.last[frm])
        p.last[frm] = t
        self.sched.at(t, self._arrive, p, frm, p.epoch, data)

    def _arrive(self, p: Pair, frm: str, epoch: int, data: bytes) -> None:
        self.in_flight -= 1
        if p.epoch != epoch or not p.up:
            return  # lost with the connection
        self.deliver_cb(p.other(frm), frm, epoch, data)

    # -- faults ------------------------------------------------------------------------
    def set_cut(self, frm: str, to: str, cut: bool) -> None:
        if cut:
            self.cut.add((frm, to))
            return
        self.cut.discard((frm, to))
        p = self.pairs.get(frozenset((frm, to)))
        if p is not None and p.up:
            held, p.held[frm] = p.held[frm], []
            for data in held:
                self._schedule(p, frm, data)
        waiting, self.notices = self.notices, []
        for q, end, epoch in waiting:
            self._notice(q, end, epoch)

    def by_kind(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = defaultdict(dict)
        for k in sorted(self.messages):
            out[k] = {"messages": self.messages[k], "bytes": self.bytes[k]}
        return dict(out)
