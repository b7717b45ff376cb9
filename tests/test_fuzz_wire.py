"""A short run of the wire fuzzer (bench/fuzz_wire.py) in the suite: a few seconds of
mutated valid messages and random bytes through the plain, compression-negotiated and
keyed decoders. The long runs (>= 10 million inputs) are done by hand; see docs/DEVELOPMENT.md."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from dedupnet.codec import wire
from dedupnet.codec.errors import ProtocolError

_spec = importlib.util.spec_from_file_location("fuzz_wire", Path(__file__).parent.parent / "bench" / "fuzz_wire.py")
fuzz_wire = importlib.util.module_from_spec(_spec)
sys.modules["fuzz_wire"] = fuzz_wire  # its dataclasses look their module up
_spec.loader.exec_module(fuzz_wire)


def test_short_fuzz_run_raises_nothing_but_protocol_errors(tmp_path):
    stats, elapsed = fuzz_wire.fuzz(20_000, 20.0, seed=7, crash_dir=str(tmp_path))
    assert stats.crashes == [], stats.crashes[0]["traceback"]
    assert stats.inputs >= 5_000
    assert set(stats.by_mode) == set(fuzz_wire.MODES)
    # It reaches past the header into every stage: tags, zstd, JSON, schema, and success.
    for reason in ("bad-magic", "bad-header", "bad-tag", "bad-compression", "bad-json", "schema", "too-large",
                   "truncated"):
        assert stats.reasons[reason] > 0, reason
    assert stats.clean > 0 and stats.messages > 0
    assert 0 < stats.max_buffered <= wire.HEADER_SIZE + fuzz_wire.MAX_FRAME + wire.MAX_TAG


def test_the_harness_catches_what_it_is_for(tmp_path, monkeypatch):
    """The fuzzer must be able to fail: a decoder that raises something else is reported."""
    original = wire.Decoder.next_message

    def broken(self):
        msg = original(self)
        if msg is not wire.NEED_DATA and self.messages % 3 == 0:
            raise KeyError("a bug")
        return msg

    monkeypatch.setattr(wire.Decoder, "next_message", broken)
    stats, _ = fuzz_wire.fuzz(3_000, 20.0, seed=3, crash_dir=str(tmp_path))
    assert stats.crashes and "KeyError" in stats.crashes[0]["error"]
    assert list(tmp_path.glob("crash-*.json"))


def test_mutator_is_seeded():
    import random

    pool = fuzz_wire.corpus(random.Random(1))
    a = [fuzz_wire.mutate(pool[i % len(pool)], random.Random(i), pool) for i in range(50)]
    b = [fuzz_wire.mutate(pool[i % len(pool)], random.Random(i), pool) for i in range(50)]
    assert a == b
    for data in pool:  # the corpus itself is valid
        try:
            wire.decode_one(data, max_frame_size=fuzz_wire.MAX_FRAME)
        except ProtocolError as exc:  # pragma: no cover
            pytest.fail(f"corpus message does not decode: {exc}")
