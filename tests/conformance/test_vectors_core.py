"""Runner 1: every vector against the sans-I/O cores, through the in-memory adapters.

Each step's input goes through the codec (encoded, then decoded, as on the wire) into
the core; every action is carried out by MemoryCenter / MemoryHost; what the core sent
is compared with the step's ``expect``, then counters and pools. Raw bytes go to
``wire.Decoder`` only: they must be refused with the named reason before any core sees
them.
"""

from __future__ import annotations

import pytest

from center_host.events import Host, Joined, Left, Peer, Received, member_from_str
from center_host.sets import SetRecord
from dedupnet.codec import wire
from dedupnet.codec.errors import ProtocolError
from local_host import protocol as hp

from .memory import MemoryCenter, MemoryHost, decode
from .vectors import (assert_sent, cases, counter_mismatches, expected_sent, message, observed_sent, pick,
                      pools_mismatch)


def on_the_wire(spec: dict):
    return decode(wire.encode(message(spec)))


class CenterUnderTest:
    def __init__(self, vector, mode: str):
        cfg = vector["config"]
        keys = ("answer_timeout", "max_resends", "partition_policy", "foreign_lookup", "local_lookup", "routing")
        self.m = MemoryCenter.make(network=cfg["network"], lan=cfg["lan"], mode=mode,
                                   peers={int(n): cidr for n, cidr in cfg.get("peers", {}).items()},
                                   **{k: cfg[k] for k in keys if k in cfg})
        init = vector["initial"]
        self.m.admitted.update(init.get("admitted", []))
        self.m.concluded.update(init.get("concluded", []))
        for ip in init.get("hosts", []):
            self.m.feed(Joined(Host(ip)))
        for n in init.get("peers", []):
            self.m.feed(Joined(Peer(n)))
        assert self.m.take_outbox() == []

    @property
    def counters(self):
        return self.m.core.counters

    def step(self, step: dict, mode: str) -> None:
        if "message" in step:
            msg = on_the_wire(pick(step["message"], mode))
            self.m.feed(Received(member_from_str(step["from"]), msg))
        elif "timer" in step:
            self.m.fire(step["timer"])
        elif "join" in step:
            self.m.feed(Joined(member_from_str(step["join"])))
        elif "leave" in step:
            self.m.feed(Left(member_from_str(step["leave"])))
        else:
            raise AssertionError(f"not a center step: {step}")

    def sent(self):
        return [(str(to), decode(data)) for to, data in self.m.take_outbox()]

    def pools(self) -> dict:
        def frames(pool):
            return {n: SetRecord.load(rec).frame.URL_set for n, rec in pool.items()}
        return {"local_reduce_pool": frames(self.m.local_reduce_pool), "dist_reduce_pool": frames(self.m.dist_reduce_pool),
                "admitted": self.m.admitted, "concluded": self.m.concluded,
                "task_URL": self.m.task_URL, "ledger": {h: sorted(u) for h, u in self.m.ledger.items() if u}}


class HostUnderTest:
    def __init__(self, vector, mode: str):
        cfg = vector["config"]
        self.m = MemoryHost.make(ip=cfg["ip"], network=cfg["network"], host_id=cfg["host_id"],
                                 set_size=cfg["set_size"], mode=mode)
        init = vector["initial"]
        self.m.finish_URL.update(init.get("finish_URL", []))
        self.m.task_pool.extend(init.get("task_pool", []))
        self.m.push(init.get("URL_pool", []))
        self.m.feed(hp.Connected())  # as the daemon does once connected to its center
        assert self.m.take_outbox() == []

    @property
    def counters(self):
        return self.m.core.counters

    def step(self, step: dict, mode: str) -> None:
        if "message" in step:
            assert step["from"] == "center", step
            self.m.feed(hp.FromCenter(on_the_wire(pick(step["message"], mode))))
        elif "walk" in step:
            self.m.walk()
        elif "reconnect" in step:
            self.m.feed(hp.Connected())
        else:
            raise AssertionError(f"not a host step: {step}")

    def sent(self):
        return [("center", decode(data)) for data in self.m.take_outbox()]

    def pools(self) -> dict:
        return {"URL_pool": list(self.m.URL_pool.values()), "task_pool": self.m.task_pool,
                "unacked": list(self.m.unacked)}


def refused(raw_hex: str) -> str:
    """The reason wire.Decoder gives for these bytes (it must refuse them)."""
    decoder = wire.Decoder()
    with pytest.raises(ProtocolError) as info:
        decoder.feed(bytes.fromhex(raw_hex))
        msg = decoder.next_message()
        pytest.fail(f"decoded {msg!r} instead of refusing the bytes")
    return info.value.reason


@pytest.mark.parametrize("vector, mode", cases())
def test_vector(vector, mode):
    party = (CenterUnderTest if vector["role"] == "center" else HostUnderTest)(vector, mode)
    for i, step in enumerate(vector["steps"], 1):
        where = f"{vector.id} [{mode}] step {i}"
        if "raw_hex" in step:
            assert refused(step["raw_hex"]) == step["expect_error"], where
        else:
            party.step(step, mode)
        assert_sent(where, observed_sent(party.sent()), expected_sent(step, mode))
        bad = counter_mismatches(party.counters, pick(step.get("expect_counters", {}), mode))
        assert not bad, f"{where}: counters (actual, expected): {bad}"
        if "expect_pools" in step:
            diff = pools_mismatch(party.pools(), pick(step["expect_pools"], mode))
            assert diff is None, f"{where}: pools differ\n{diff}"
    diff = pools_mismatch(party.pools(), pick(vector["final"], mode))
    assert diff is None, f"{vector.id} [{mode}] final pools differ\n{diff}"
