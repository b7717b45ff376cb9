"""The fault vocabulary of ``dedupnet sim --fault SPEC`` and ``--chaos N``.

The product promises no duplicate crawl and no lost URL (design guide; source protocol
§2.2-§2.4 say nothing about failures, docs/PROTOCOL.md fills the gaps). A promise like
that is only worth what the faults it has survived: this module names the faults, parses
them from the command line and draws reproducible random schedules of them. It knows
nothing about how a fault is carried out: process faults are done by
:mod:`dedupnet.harness.simproc` (signals to the daemons' processes, a kill of the Redis server),
link faults by the fault-injecting relay. Both share this one vocabulary.

A spec is ``KIND`` or ``KIND:key=value,...`` with the keys ``at`` (a fraction 0..1 of
the pages to fetch: the fault starts once that share of the run's reachable URLs has been
fetched), ``for`` (seconds down, frozen or cut) and ``target``::

    kill-host
    kill-host:at=0.3,for=5,target=host:1.0
    freeze-center:for=8,target=center:2
    partition:target=wan:1-2,for=20

``kill-host-redis`` kills the Redis server a host started itself (that host runs with its
own embedded server instead of the shared one); nobody restarts it but the host daemon,
so the fault has no duration.

``power-cut`` takes every machine down at once: every daemon runs its own embedded Redis
with its data on its own loop-mounted ext4, and at the cut each filesystem is shut down
without flushing its journal, every process is SIGKILLed, and after the duration the
filesystems are mounted again and every daemon started on its data (root only;
:mod:`dedupnet.harness.powercut`). Its target is ``redis`` (all of them). Chaos never
draws it: it needs a run set up for it.

``host-gone-disk-lost`` SIGKILLs a host and deletes its Redis data, for good: nobody
starts it again. Its center re-issues its unfinished tasks to the LAN's other hosts once
it has been silent for ``reissue_after`` (docs/PROTOCOL.md section 12), which the run
must set below its timeout (``--reissue-after``); chaos never draws it either.

Targets: ``host:<network>.<index>`` (index 0-based: ``host:1.0`` is 127.0.1.10, the
first host of network 1), ``center:<network>``, ``wan:<a>-<b>`` (the link between two
networks' centers), ``redis`` (the server the daemons use; in the simulation they share
one, so it is the same as ``redis:all``). What is not given is drawn from the run's seed
(:func:`resolve`), so one seed is one run.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace

__all__ = ["PROCESS_FAULTS", "SET_UP_FAULTS", "LINK_FAULTS", "FAULTS", "Fault", "parse_fault", "format_fault", "resolve",
           "chaos_schedule", "DEFAULT_DURATION"]

PROCESS_FAULTS = ("kill-host", "kill-center", "kill-redis", "freeze-host", "freeze-center", "leave-host",
                  "kill-host-redis", "power-cut", "host-gone-disk-lost")
#: Kinds a run must be set up for: chaos never draws them.
SET_UP_FAULTS = ("power-cut", "host-gone-disk-lost")
LINK_FAULTS = ("partition", "lossy-wan", "lossy-lan", "duplicate-frames")
FAULTS = PROCESS_FAULTS + LINK_FAULTS

#: Seconds a fault lasts when the spec does not say. Freezes are longer than the
#: daemons' default heartbeat timeout (5 s): a frozen member must be survivable even
#: after its peers have given it up. ``leave-host`` is for good and the lossy link
#: faults last to the end of the run (None).
DEFAULT_DURATION: dict[str, float | None] = {
    "kill-host": 3.0, "kill-center": 3.0, "kill-redis": 2.0,
    "freeze-host": 7.0, "freeze-center": 7.0, "leave-host": None, "kill-host-redis": None, "power-cut": 1.0,
    "host-gone-disk-lost": None,
    "partition": 20.0, "lossy-wan": None, "lossy-lan": None, "duplicate-frames": None,
}

#: What each kind may hit (the first token of its target).
TARGET_ROLES: dict[str, tuple[str, ...]] = {
    "kill-host": ("host",), "freeze-host": ("host",), "leave-host": ("host",), "lossy-lan": ("host",),
    "kill-center": ("center",), "freeze-center": ("center",),
    "kill-redis": ("redis",), "kill-host-redis": ("host",), "power-cut": ("redis",), "host-gone-disk-lost": ("host",),
    "partition": ("wan",), "lossy-wan": ("wan",), "duplicate-frames": ("wan", "host"),
}

#: Range of ``at`` (share of the pages fetched) and of the duration a chaos schedule draws.
CHAOS_AT = (0.1, 0.7)
CHAOS_DURATION: dict[str, tuple[float, float]] = {
    "kill-host": (1.0, 5.0), "kill-center": (1.0, 5.0), "kill-redis": (1.0, 4.0),
    "freeze-host": (2.0, 8.0), "freeze-center": (2.0, 8.0),
    "partition": (5.0, 20.0), "lossy-wan": (10.0, 30.0), "lossy-lan": (10.0, 30.0), "duplicate-frames": (10.0, 30.0),
}

_TARGET = re.compile(r"^(?:host:(\d+)\.(\d+)|center:(\d+)|wan:(\d+)-(\d+)|redis(?::all)?)$")


@dataclass(frozen=True)
class Fault:
    kind: str                       # one of PROCESS_FAULTS + LINK_FAULTS
    at: float | None = None         # fraction of the pages fetched when it starts (0..1); None: drawn from the run's seed
    duration: float | None = None   # seconds down / frozen / cut; None: the kind's default
    target: str | None = None       # "host:<network>.<index>", "center:<network>", "wan:<a>-<b>", "redis", "redis:all"; None: drawn

    def __post_init__(self) -> None:
        if self.kind not in FAULTS:
            raise ValueError(f"unknown fault {self.kind!r} (known: {', '.join(FAULTS)})")
        if self.at is not None and not 0.0 <= self.at <= 1.0:
            raise ValueError(f"{self.kind}: at={self.at} is not a fraction of the pages in 0..1")
        if self.duration is not None and self.duration < 0:
            raise ValueError(f"{self.kind}: for={self.duration} is negative")
        if self.target is not None:
            role = target_role(self.target)
            if role not in TARGET_ROLES[self.kind]:
                want = " or ".join(_TARGET_HELP[r] for r in TARGET_ROLES[self.kind])
                raise ValueError(f"{self.kind} cannot hit {self.target!r}: its target is {want}")


_TARGET_HELP = {"host": "host:<network>.<index>", "center": "center:<network>", "wan": "wan:<a>-<b>",
                "redis": "redis or redis:all"}


def target_role(target: str) -> str:
    """``host``, ``center``, ``wan`` or ``redis``; ValueError for anything else."""
    m = _TARGET.match(target)
    if m is None:
        raise ValueError(f"bad fault target {target!r} (want host:<network>.<index>, center:<network>, "
                         f"wan:<a>-<b>, redis or redis:all)")
    if m.group(1) is not None:
        return "host"
    if m.group(3) is not None:
        return "center"
    if m.group(4) is not None:
        if m.group(4) == m.group(5):
            raise ValueError(f"bad fault target {target!r}: a WAN link joins two different networks")
        return "wan"
    return "redis"


def target_parts(target: str) -> tuple[int, ...]:
    """The numbers of a target: ``host:1.0`` -> (1, 0), ``center:2`` -> (2,), ``wan:1-2`` -> (1, 2), redis -> ()."""
    return tuple(int(g) for g in _TARGET.match(target).groups() if g is not None)


def parse_fault(spec: str) -> Fault:
    """``KIND[:key=value,...]`` (keys ``at``, ``for``, ``target``) -> :class:`Fault`.
    Raises ValueError with a message that says what is wrong and what is expected."""
    kind, _, rest = spec.strip().partition(":")
    if kind not in FAULTS:
        raise ValueError(f"unknown fault {kind!r} in {spec!r} (known: {', '.join(FAULTS)})")
    fields: dict[str, object] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))) if rest else ():
        key, eq, value = item.partition("=")
        if not eq or not value:
            raise ValueError(f"{spec!r}: {item!r} is not key=value (keys: at, for, target)")
        name = {"at": "at", "for": "duration", "target": "target"}.get(key)
        if name is None:
            raise ValueError(f"{spec!r}: unknown key {key!r} (keys: at, for, target)")
        if name in fields:
            raise ValueError(f"{spec!r}: {key} given twice")
        if name == "target":
            fields[name] = value
        else:
            try:
                fields[name] = float(value)
            except ValueError:
                raise ValueError(f"{spec!r}: {key}={value!r} is not a number") from None
    return Fault(kind, **fields)  # __post_init__ checks ranges and targets


def format_fault(f: Fault) -> str:
    """The spec that :func:`parse_fault` reads back as ``f`` (what a chaos line prints)."""
    parts = []
    if f.at is not None:
        parts.append(f"at={f.at:g}")
    if f.duration is not None:
        parts.append(f"for={f.duration:g}")
    if f.target is not None:
        parts.append(f"target={f.target}")
    return f.kind + (":" + ",".join(parts) if parts else "")


def targets(kind: str, networks: int, hosts: int) -> list[str]:
    """Every target ``kind`` can hit in a layout of ``networks`` x ``hosts``."""
    out: list[str] = []
    for role in TARGET_ROLES[kind]:
        if role == "host":
            out += [f"host:{n}.{i}" for n in range(1, networks + 1) for i in range(hosts)]
        elif role == "center":
            out += [f"center:{n}" for n in range(1, networks + 1)]
        elif role == "wan":
            out += [f"wan:{a}-{b}" for a in range(1, networks + 1) for b in range(a + 1, networks + 1)]
        else:
            out.append("redis")
    return out


def check_target(f: Fault, networks: int, hosts: int) -> None:
    """ValueError unless ``f``'s target exists in this layout (and a leaving host is not
    its network's last one: nobody would be left to crawl the network's tasks)."""
    if f.kind in ("leave-host", "host-gone-disk-lost") and hosts < 2:
        raise ValueError(f"{f.kind} needs at least 2 hosts per network: the one left crawls the network's tasks")
    if f.target is None:
        return
    if target_role(f.target) == "redis":
        return
    nums = target_parts(f.target)
    if any(n < 1 or n > networks for n in (nums[:1] if target_role(f.target) == "host" else nums)):
        raise ValueError(f"{format_fault(f)}: no network {nums} in a layout of {networks} networks")
    if target_role(f.target) == "host" and not 0 <= nums[1] < hosts:
        raise ValueError(f"{format_fault(f)}: host index {nums[1]} is not in 0..{hosts - 1} "
                         f"(host:<network>.<index>, 0-based: host:1.0 is 127.0.1.10)")


def resolve(f: Fault, seed: int, networks: int, hosts: int, index: int = 0) -> Fault:
    """``f`` with every field filled: ``at`` and ``target`` drawn from ``(seed, index)``
    (``index``: the fault's place in the run's list), ``duration`` the kind's default.
    The same arguments give the same fault."""
    check_target(f, networks, hosts)
    rng = random.Random(f"{seed}:{index}:{f.kind}")
    at = f.at if f.at is not None else round(rng.uniform(*CHAOS_AT), 2)
    target = f.target if f.target is not None else rng.choice(targets(f.kind, networks, hosts))
    duration = f.duration if f.duration is not None else DEFAULT_DURATION[f.kind]
    return replace(f, at=at, target=target, duration=duration)


def chaos_schedule(seed: int, networks: int, hosts: int, n: int, *,
                   kinds: tuple[str, ...] = FAULTS, max_faults: int = 2) -> list[tuple[Fault, ...]]:
    """``n`` random fault schedules, each of 1..``max_faults`` faults of ``kinds``, every
    field drawn (so a schedule prints as specs that reproduce it). Schedule ``i`` depends
    on ``seed`` and ``i`` only, not on ``n``: a longer chaos run starts with the same
    schedules. ``kinds`` lets a runner draw only the faults it can carry out."""
    if n < 0:
        raise ValueError("the number of chaos schedules must be >= 0")
    if not kinds:
        raise ValueError("chaos needs at least one fault kind")
    unknown = [k for k in kinds if k not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}")
    usable = tuple(k for k in kinds if not (k == "leave-host" and hosts < 2)
                   and not (k in ("partition", "lossy-wan") and networks < 2))
    if not usable:
        raise ValueError(f"none of {', '.join(kinds)} can run on {networks} x {hosts}")
    schedules = []
    for i in range(n):
        rng = random.Random(f"chaos:{seed}:{i}")
        faults = []
        for j in range(rng.randint(1, max_faults)):
            kind = rng.choice(usable)
            if kind == "leave-host" and any(f.kind == "leave-host" for f in faults):
                kind = "kill-host" if "kill-host" in usable else kind
            lo, hi = CHAOS_DURATION.get(kind, (0.0, 0.0))
            duration = None if DEFAULT_DURATION[kind] is None else round(rng.uniform(lo, hi), 1)
            faults.append(Fault(kind, at=round(rng.uniform(*CHAOS_AT), 2), duration=duration,
                                target=rng.choice(targets(kind, networks, hosts))))
        schedules.append(tuple(sorted(faults, key=lambda f: f.at)))
    return schedules
