"""One deterministic simulation from a seed, its check, its costs, and its replay."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

from .check import Outcome, check
from .faults import Fault
from .world import DstConfig, World


@dataclass
class Result:
    config: DstConfig
    schedule: list[Fault]
    outcome: Outcome
    trace_hash: str
    virtual: float
    wall: float
    steps: int
    costs: dict = field(default_factory=dict)
    recent: list = field(default_factory=list)
    fault_log: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.outcome.violations


def simulate(cfg: DstConfig) -> Result:
    return run_world(cfg)[0]


def run_world(cfg: DstConfig) -> tuple[Result, World]:
    t0 = time.perf_counter()
    world = World(cfg)
    # The cores log each set's steps; thousands of runs would drown a terminal.
    logger = logging.getLogger("dedupnet")
    level, logger.level = logger.level, logging.CRITICAL
    try:
        world.run()
    finally:
        logger.setLevel(level)
    outcome = check(world)
    wall = time.perf_counter() - t0
    return Result(cfg, world.schedule, outcome, world.sched.trace_hash, world.sched.now, wall, world.sched.steps,
                  costs(world), list(world.sched.recent), world.fault_log), world


def replay_command(cfg: DstConfig, schedule: list[Fault]) -> str:
    d = DstConfig()
    args = [f"--networks {cfg.networks}", f"--hosts {cfg.hosts}", f"--pages {cfg.pages}", f"--sites {cfg.sites}",
            f"--seed {cfg.seed}"]
    if cfg.mode != d.mode:
        args.append(f"--mode {cfg.mode}")
    if cfg.routing is not None:
        args.append(f"--routing {cfg.routing}")
    if cfg.schedule is not None:
        args += [f"--fault {f}" for f in schedule]
    else:
        args.append(f"--faults {cfg.faults}")
        if cfg.kinds != d.kinds:
            args.append(f"--kinds {','.join(cfg.kinds)}")
    return "dedupnet simulate " + " ".join(args)


def trace_of(cfg: DstConfig, urls: list[str]) -> list[str]:
    """Replay ``cfg`` keeping every step of ``urls`` (and the faults): the story of a
    violation, from the same seed."""
    _, world = run_world(replace(cfg, watch=frozenset(urls)))
    return world.watch_log


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def costs(world: World) -> dict:
    """Per URL fetched: messages and bytes by kind, store look-ups and transactions per
    role, stored entries (fingerprints, numbers) per role, discovery-to-admission latency."""
    urls = max(1, len(world.web.answered))
    centers = [c for c in world.centers.values()]
    hosts = [h for h in world.hosts.values()]
    wan_msgs = sum(v for k, v in world.delivered.items() if k.startswith("wan"))
    lan_msgs = sum(v for k, v in world.delivered.items() if k.startswith("lan"))
    wan_bytes = sum(v for k, v in world.delivered_bytes.items() if k.startswith("wan"))
    lan_bytes = sum(v for k, v in world.delivered_bytes.items() if k.startswith("lan"))
    return {
        "urls_fetched": len(world.web.answered),
        "urls_found": len(world.discovered),
        "messages_per_url": {"wan": wan_msgs / urls, "lan": lan_msgs / urls},
        "bytes_per_url": {"wan": wan_bytes / urls, "lan": lan_bytes / urls},
        "by_kind": {k: {"messages": world.delivered[k], "bytes": world.delivered_bytes[k]}
                    for k in sorted(world.delivered)},
        "center_lookups_per_url": sum(c.lookups for c in centers) / urls,
        "center_writes_per_url": sum(c.transactions for c in centers) / urls,
        "host_lookups_per_url": sum(h.lookups for h in hosts) / urls,
        "host_writes_per_url": sum(h.transactions for h in hosts) / urls,
        "center_entries_per_url": sum(len(c.store.admitted) + len(c.store.concluded) for c in centers) / urls,
        "host_entries_per_url": sum(len(h.store.finished) + len(h.store.task_fp) for h in hosts) / urls,
        "admit_latency_p50": percentile(world.admit_latency, 50),
        "admit_latency_p99": percentile(world.admit_latency, 99),
        "center_events": sum(c.events for c in centers),
        "host_events": sum(h.events for h in hosts),
    }
