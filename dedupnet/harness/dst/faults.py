"""The faults of a deterministic simulation, and random schedules of them.

Every fault starts when a share ``at`` of the run's reachable URLs has been answered
(so a schedule means the same on any web size) and, except those that are for good,
ends ``duration`` virtual seconds later. Kinds:

process   crash-host, crash-center    the process dies (the kernel closes its sockets)
                                      and restarts; its Redis keeps everything
          power-host, power-center    the machine dies: no FIN (peers notice by their
                                      heartbeat deadline), Redis loses the writes since
                                      its last fsync (``appendfsync everysec``)
          wipe-host                   the machine comes back on an empty Redis
          lost-host                   the host never returns (its machine is gone)
          freeze-host, freeze-center  the process stops (SIGSTOP, a VM pause), then goes on
          redis-outage                a daemon's Redis does not answer; its heartbeats go on
network   partition-wan, partition-lan  both directions of a link cut, then healed
          half-open                   one direction cut (the other still passes)
          reset                       a connection reset: what was in flight is lost
          slow-wan                    a WAN link's latency times 20..100
membership add-network                a network joins (docs/PROTOCOL.md §11, "Changing the
                                      map"): its center and hosts start, every other center
                                      restarts within 10 s with it configured and the map
                                      before the change in ``previous_weights``
          remove-network              under home routing a network is retired (weight 0,
                                      the earlier map kept): its daemons go on, home to no
                                      site; when broadcasting it is given up: its daemons
                                      stop for good and the others restart without it
"""

from __future__ import annotations

import random
from dataclasses import dataclass

KINDS = ("crash-host", "crash-center", "power-host", "power-center", "wipe-host", "lost-host",
         "freeze-host", "freeze-center", "redis-outage", "partition-wan", "partition-lan", "half-open",
         "reset", "slow-wan", "add-network", "remove-network")

#: Kinds that end by themselves (the others are for good).
FOR_GOOD = ("lost-host", "add-network", "remove-network", "reset")

DURATION = {"crash-host": (0.5, 10), "crash-center": (0.5, 10), "power-host": (1, 20), "power-center": (1, 20),
            "wipe-host": (1, 10), "freeze-host": (1, 15), "freeze-center": (1, 15), "redis-outage": (0.5, 10),
            "partition-wan": (1, 40), "partition-lan": (1, 20), "half-open": (1, 30), "slow-wan": (5, 60)}


@dataclass(frozen=True)
class Fault:
    kind: str
    at: float  # share of the reachable URLs answered when it starts
    duration: float  # virtual seconds (0 for those for good)
    target: str  # "host:N.I", "center:N", "wan:A-B", "lan:N.I", "net:N"

    def __str__(self) -> str:
        d = f",for={self.duration:g}" if self.duration else ""
        return f"{self.kind}:at={self.at:g}{d},target={self.target}"


def parse(spec: str) -> Fault:
    """``KIND:at=F,for=S,target=T`` (all three keys needed), as :meth:`Fault.__str__` prints."""
    kind, _, rest = spec.partition(":")
    if kind not in KINDS:
        raise ValueError(f"unknown fault {kind!r} (known: {', '.join(KINDS)})")
    keys = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    return Fault(kind, float(keys.get("at", 0.3)), float(keys.get("for", 0)), keys.get("target", ""))


def draw(rng: random.Random, kind: str, networks: int, hosts: int, removable: list[int]) -> Fault:
    at = round(0.05 + 0.75 * rng.random(), 3)
    lo, hi = DURATION.get(kind, (0, 0))
    duration = round(lo + (hi - lo) * rng.random(), 2) if kind not in FOR_GOOD else 0.0
    n = 1 + int(rng.random() * networks)
    i = int(rng.random() * hosts)
    if kind.endswith("-host"):
        target = f"host:{n}.{i}"
    elif kind.endswith("-center"):
        target = f"center:{n}"
    elif kind == "redis-outage":
        target = f"host:{n}.{i}" if rng.random() < 0.5 else f"center:{n}"
    elif networks > 1 and (kind in ("partition-wan", "slow-wan")
                           or (kind in ("half-open", "reset") and rng.random() < 0.5)):
        m = 1 + (n + int(rng.random() * (networks - 1))) % networks
        target = f"wan:{min(n, m)}-{max(n, m)}" if m != n else f"wan:1-{networks}"
    elif kind in ("partition-lan", "half-open", "reset"):
        target = f"lan:{n}.{i}"
    else:  # add-network, remove-network
        target = f"net:{removable[int(rng.random() * len(removable))] if removable else networks}"
    if kind == "half-open":
        target += ":" + ("up" if rng.random() < 0.5 else "down")
    return Fault(kind, at, duration, target)


def schedule(seed: int, networks: int, hosts: int, count: int, kinds: tuple[str, ...] = KINDS) -> list[Fault]:
    """``count`` faults drawn from ``kinds`` for run ``seed``: the same seed, the same
    schedule. At most one membership change per schedule, and none with two networks."""
    rng = random.Random(f"dst-faults-{seed}")
    faults: list[Fault] = []
    usable = [k for k in kinds if networks > 2 or k not in ("add-network", "remove-network")]
    if networks < 2:
        usable = [k for k in usable if "wan" not in k]
    membership = False
    while len(faults) < count and usable:
        kind = usable[int(rng.random() * len(usable))]
        if kind in ("add-network", "remove-network"):
            if membership:
                continue
            membership = True
        faults.append(draw(rng, kind, networks, hosts, list(range(2, networks + 1))))
    return sorted(faults, key=lambda f: f.at)
