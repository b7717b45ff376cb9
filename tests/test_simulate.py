"""dedupnet simulate (dedupnet/harness/dst): the protocol's own cores under seeded fault
schedules in virtual time. Deterministic, so every assertion here is about one exact
history; no wall-clock figure is asserted."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from center_host.events import LookupDone
from center_host.protocol import CenterProtocol
from dedupnet.cli import main
from dedupnet.harness.dst import faults as fl
from dedupnet.harness.dst.run import simulate, trace_of
from dedupnet.harness.dst.world import DstConfig

#: The suite's short version: these seeds, each a 4x3 run with three faults.
SEEDS = range(1, 51)
SMALL = dict(networks=4, hosts=3, pages=1000, sites=20)


def test_same_seed_same_trace():
    cfg = DstConfig(seed=7, **SMALL)
    a, b = simulate(cfg), simulate(cfg)
    assert a.trace_hash == b.trace_hash and a.virtual == b.virtual and a.outcome == b.outcome
    assert simulate(DstConfig(seed=8, **SMALL)).trace_hash != a.trace_hash


def test_same_trace_under_another_hash_seed():
    """String hashing differs between interpreters (PYTHONHASHSEED); the history must not."""
    code = ("from dedupnet.harness.dst.run import simulate; from dedupnet.harness.dst.world import DstConfig; "
            "print(simulate(DstConfig(seed=5, networks=3, hosts=2, pages=600, sites=10)).trace_hash)")
    hashes = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": str(s)}).stdout.strip() for s in (1, 2)}
    assert len(hashes) == 1


@pytest.mark.slow
def test_short_run_has_no_violation():
    """Every kind of fault, three per schedule."""
    failed = {}
    for seed in SEEDS:
        r = simulate(DstConfig(seed=seed, **SMALL))
        if not r.ok:
            failed[seed] = [str(v) for v in r.outcome.violations]
    assert not failed


def test_schedules_hold_every_kind():
    drawn = [f for seed in SEEDS for f in fl.schedule(seed, 4, 3, 3)]
    assert all(len(fl.schedule(seed, 4, 3, 3)) == 3 for seed in SEEDS)
    assert {f.kind for f in drawn} == set(fl.KINDS)
    assert any(f.kind == "wipe-host" for f in drawn) and any(f.kind == "lost-host" for f in drawn)


class _NoClaims(dict):
    """R2 taken out: answering another network's set, a center no longer sees its own
    sets' claims (docs/PROTOCOL.md §10)."""

    def get(self, key, default=None):
        return default


@pytest.fixture
def without_r2(monkeypatch):
    init = CenterProtocol.__init__

    def init_without_r2(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.claims.by_url = _NoClaims()

    monkeypatch.setattr(CenterProtocol, "__init__", init_without_r2)


@pytest.fixture
def without_r1_record(monkeypatch):
    """R1 without its first half: a center's own set no longer drops what its admitted
    record holds (every look-up answers 'not admitted')."""
    handle = CenterProtocol.handle

    def handle_without(self, event):
        if isinstance(event, LookupDone):
            event = dataclasses.replace(event, admitted=[False] * len(event.admitted))
        return handle(self, event)

    monkeypatch.setattr(CenterProtocol, "handle", handle_without)


def _caught(**kwargs) -> list[int]:
    return [seed for seed in SEEDS[:5] if any(v.kind == "admitted twice" for v in simulate(
        DstConfig(seed=seed, faults=0, **SMALL, **kwargs)).outcome.violations)]


def test_checker_catches_r2_taken_out(without_r2):
    assert _caught(routing="broadcast")


def test_checker_catches_r1_taken_out(without_r1_record):
    assert _caught()


def test_violation_story_replays_from_the_seed(without_r2):
    cfg = DstConfig(seed=1, faults=0, routing="broadcast", **SMALL)
    twice = next(v for v in simulate(cfg).outcome.violations if v.kind == "admitted twice")
    story = trace_of(cfg, twice.urls[:1])
    assert sum(": admits " in line for line in story) >= 2
    assert any("flag3" in line and line.endswith("= 0") for line in story)


def test_lost_host_is_survived():
    """A host that never returns: its work is counted stranded, the rest goes on."""
    r = simulate(DstConfig(seed=3, schedule=(fl.parse("lost-host:at=0.3,target=host:2.1"),), **SMALL))
    assert r.ok, [str(v) for v in r.outcome.violations]


def test_host_restarted_on_empty_redis_loses_nothing():
    """The schedule that lost URLs before a reused number was refused (its sets were
    acknowledged as repeats): the host now numbers them again."""
    r = simulate(DstConfig(seed=45, pages=2000, sites=20, schedule=(
        fl.parse("wipe-host:at=0.343,for=1.72,target=host:2.0"),)))
    assert r.ok, [str(v) for v in r.outcome.violations]


def test_cli(capsys, without_r2):
    assert main(["simulate", "--runs", "2", "--pages", "600", "--sites", "10", "--networks", "1", "--hosts", "3",
                 "--kinds", "crash-host,partition-lan"]) == 0
    out = capsys.readouterr().out
    assert out.count(" ok ") == 2 and "2 runs, 0 with violations" in out
    assert main(["simulate", "--seed", "1", "--pages", "1000", "--faults", "0", "--routing", "broadcast"]) == 1
    out = capsys.readouterr().out
    assert "admitted twice" in out and ": admits " in out
    assert ("replay: dedupnet simulate --networks 4 --hosts 3 --pages 1000 --sites 20 --seed 1 --routing broadcast "
            "--faults 0") in out


def test_network_added_under_home_routing_loses_nothing():
    """Found by this simulator: a set routed under the earlier map, passed on by its old
    home with the origin's IP and number, was refused by the new home for ever."""
    r = simulate(DstConfig(seed=4, schedule=(fl.parse("add-network:at=0.384,target=net:3"),), **SMALL))
    assert r.ok, [str(v) for v in r.outcome.violations]


def test_network_retired_under_home_routing_loses_nothing():
    """Found by this simulator: a retired network answered "seen" from the claim of a set
    it was routing to the new home, which then dropped both copies."""
    r = simulate(DstConfig(seed=71, faults=3, **SMALL))
    assert r.ok, [str(v) for v in r.outcome.violations]
