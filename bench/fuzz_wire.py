"""Fuzz the wire decoder: mutated valid messages and random bytes, in random chunkings.

The decoder (:class:`dedupnet.codec.wire.Decoder`) is what every byte from the network meets
first, so it must turn *any* input into messages or a :class:`ProtocolError` — never
another exception, never a hang, never a buffer above :attr:`Decoder.max_buffer`.
This runs it in four configurations, round robin:

* ``plain``: compression not negotiated (``allow_compressed=False``);
* ``compressed``: compression negotiated;
* ``keyed``: compression negotiated and a LAN keyring (every message needs a valid HMAC
  tag, dedupnet/codec/auth.py); half of its mutated inputs are re-signed with the right key
  after mutating, so the body parser behind the tag check is fuzzed too;
* ``stream``: a ``deflate-stream`` connection after its switch (the decoder inflates
  first): most inputs are mutated messages deflated (so they reach the framing layer
  through the inflater), the rest deflated streams mutated (garbage to the inflater).

Inputs: a corpus of valid messages of every kind (frames of 0-400 URLs, odd URLs and
IPs, plain and zstd bodies, tagged and not), mutated by a hand-rolled, seeded mutator
(bit flips, random bytes, inserts, deletes, duplicated and spliced ranges, header
fields set to edge values, bodies edited with the length fixed up, several messages
back to back), plus purely random bytes. Each input is fed in random chunks, drained
after every chunk, then :meth:`Decoder.eof`.

Why hand-rolled and not atheris: atheris needs a libFuzzer-instrumented build on
Python 3.11 (no wheel for this platform to rely on), and coverage-guided mutation adds
little here: the decoder's branches are few and shallow (header fields, zstd, JSON,
schema), which structure-aware mutations of valid messages reach directly. The
mutator is seeded, so a failure is reproducible from ``--seed`` and its input, which
is written out.

It reports inputs/s, the outcomes (messages decoded, ProtocolError reasons), every
exception other than ProtocolError (with the input, hex, in ``--crash-dir``), and the
largest buffer the decoder held (``Decoder.buffered``) and the most bytes it had pending.

Run: ``.venv/bin/python bench/fuzz_wire.py --inputs 100000`` or ``--minutes 10``;
exit status 1 if anything but ProtocolError was raised or a bound was broken.
"""

from __future__ import annotations

from pathlib import Path
import argparse
import json
import os
import random
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.codec import wire  # noqa: E402
from dedupnet.codec.auth import Keyring  # noqa: E402
from dedupnet.codec.errors import ProtocolError  # noqa: E402
from dedupnet.codec.messages import Ack, Error, Frame, Heartbeat, Register, Status, Task, Welcome  # noqa: E402

MODES = ("plain", "compressed", "keyed", "stream")
MAX_FRAME = 256 * 1024  # small enough to fuzz fast, large enough for every corpus message
KEY = bytes(range(32))


def corpus(rnd: random.Random) -> list[bytes]:
    """Valid encoded messages of every kind, plain and (where worth it) compressed."""
    msgs: list = [
        Register("127.0.1.10", 1, "host", "127.0.1.10:7001", "127.0.1.0/24", ("zstd",)),
        Register("::1", 65535, "center", "[::1]:7000"),
        Register("10.0.0.1", 2, "control", "10.0.0.1:1"),
        Heartbeat("127.0.1.10", 1700000000.25),
        Ack(2**40 + 7, "stored"), Ack(1, "rejected", "too-many-urls"), Ack(3, "duplicate"),
        Task(9, tuple(f"http://s{i}.test/p/{i}" for i in range(30))), Task(10, ()),
        Status(True), Status(False, {"role": "center", "pools": {"task_URL": 3}, "x": [1, 2.5, None]}),
        Error("bad-tag", "no key"), Welcome(("zstd",)), Welcome(),
    ]
    for n in (0, 1, 5, 40, 400):
        urls = {f"http://site{rnd.randrange(50)}.test/a/{i}?q={rnd.randrange(10**6)}": rnd.randrange(2) for i in range(n)}
        for flag in (1, 2, 3):
            msgs.append(Frame(urls, "127.0.2.11", rnd.randrange(2**62), flag))
    msgs.append(Frame({"http://xn--bcher-kva.test/ü?a=%20": 0, "https://[::1]:8080/": 1}, "2001:db8::1", 5, 1))
    out = []
    for m in msgs:
        out.append(wire.encode(m))
        small = wire.encode(m, compress=True)
        if wire.is_compressed(small):
            out.append(small)
    return out


INTERESTING = (0, 1, 2, 3, 7, 8, 15, 16, 17, 18, 0x7F, 0x80, 0xFF)
INTERESTING32 = (0, 1, 15, 16, 17, 255, 256, MAX_FRAME - 1, MAX_FRAME, MAX_FRAME + 1, 2**31 - 1, 2**32 - 1)


def mutate(data: bytes, rnd: random.Random, pool: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(rnd.choice((1, 1, 1, 2, 3, 5))):
        op = rnd.randrange(12)
        n = len(buf)
        if op == 0 and n:  # flip a bit
            i = rnd.randrange(n)
            buf[i] ^= 1 << rnd.randrange(8)
        elif op == 1 and n:  # a random byte
            buf[rnd.randrange(n)] = rnd.randrange(256)
        elif op == 2 and n:  # an interesting byte in the header
            buf[rnd.randrange(min(n, 16))] = rnd.choice(INTERESTING)
        elif op == 3 and n >= 8:  # body_len
            buf[4:8] = rnd.choice(INTERESTING32).to_bytes(4, "big")
        elif op == 4:  # insert random bytes
            i = rnd.randrange(n + 1)
            buf[i:i] = rnd.randbytes(rnd.choice((1, 2, 4, 16, 100)))
        elif op == 5 and n:  # delete a range
            i = rnd.randrange(n)
            del buf[i : i + rnd.choice((1, 2, 8, 64, n))]
        elif op == 6 and n:  # duplicate a range
            i = rnd.randrange(n)
            j = min(n, i + rnd.choice((1, 4, 16, 256)))
            buf[j:j] = buf[i:j]
        elif op == 7:  # splice with another input
            other = rnd.choice(pool)
            cut = rnd.randrange(len(buf) + 1)
            buf = buf[:cut] + other[rnd.randrange(len(other) + 1):]
        elif op == 8 and n > 16:  # edit the body, then fix body_len (reaches the JSON/schema checks)
            body = bytearray(buf[16 : 16 + int.from_bytes(buf[4:8], "big")])
            if body:
                for _ in range(rnd.randint(1, 4)):
                    k = rnd.randrange(len(body))
                    body[k] = rnd.choice(b'{}[]":,0123456789.eE-+\\untrufalsx\x00\xff ')
                if rnd.random() < 0.3:
                    k = rnd.randrange(len(body))
                    body[k:k] = rnd.choice((b'"x":1,', b"1e999", b'"\\ud800"', b"[" * 50, b"-0", b"null"))
                buf = buf[:4] + len(body).to_bytes(4, "big") + buf[8:16] + body + buf[16 + n:]
        elif op == 9:  # append another message
            buf += rnd.choice(pool)
        elif op == 10 and n > 9:  # flags / tag_len
            buf[rnd.choice((8, 9))] = rnd.choice(INTERESTING)
        elif op == 11 and n:  # truncate
            del buf[rnd.randrange(n):]
    return bytes(buf)


@dataclass
class Stats:
    inputs: int = 0
    messages: int = 0
    clean: int = 0  # inputs that decoded to the end without error
    reasons: Counter = field(default_factory=Counter)
    crashes: list = field(default_factory=list)
    max_buffered: int = 0
    max_pending: int = 0
    by_mode: Counter = field(default_factory=Counter)


def chunks(data: bytes, rnd: random.Random):
    roll = rnd.random()
    if roll < 0.4:
        yield data
        return
    i = 0
    if roll < 0.6:  # the first bytes one at a time (the header's early checks), then the rest
        head = rnd.randint(1, 40)
        while i < min(head, len(data)):
            yield data[i : i + 1]
            i += 1
        yield data[i:]
        return
    while i < len(data):  # random cuts
        step = rnd.choice((2, 3, 7, 16, 17, 100, 1000, 4096))
        yield data[i : i + step]
        i += step


def decoder_for(mode: str, keyring: Keyring) -> wire.Decoder:
    if mode == "plain":
        return wire.Decoder(MAX_FRAME, 1000, allow_compressed=False)
    if mode == "compressed":
        return wire.Decoder(MAX_FRAME, 1000, allow_compressed=True)
    if mode == "stream":
        decoder = wire.Decoder(MAX_FRAME, 1000, allow_compressed=False)
        decoder.start_inflate()
        return decoder
    return wire.Decoder(MAX_FRAME, 1000, allow_compressed=True, keyring=keyring)


def run_one(data: bytes, mode: str, rnd: random.Random, keyring: Keyring, stats: Stats, crash_dir: str | None) -> None:
    decoder = decoder_for(mode, keyring)
    bound = decoder.max_buffer
    try:
        for part in chunks(data, rnd):
            decoder.feed(part)
            while decoder.next_message() is not wire.NEED_DATA:
                stats.messages += 1
            if decoder.buffered > stats.max_buffered:
                stats.max_buffered = decoder.buffered
            if decoder.pending > stats.max_pending:
                stats.max_pending = decoder.pending
            if decoder.buffered > bound:
                raise AssertionError(f"decoder buffered {decoder.buffered} bytes, more than its bound {bound}")
        decoder.eof()
        stats.clean += 1
    except ProtocolError as exc:
        stats.reasons[exc.reason] += 1
        # Poisoned: it must say the same again.
        try:
            decoder.next_message()
        except ProtocolError as again:
            if again.reason != exc.reason:
                raise AssertionError("a poisoned decoder changed its error") from None
        else:
            raise AssertionError("a decoder did not stay poisoned after an error")
    except Exception as exc:  # noqa: BLE001 - the point: anything else is a finding
        record = {"mode": mode, "error": repr(exc), "traceback": traceback.format_exc(), "input": data.hex()}
        stats.crashes.append(record)
        print(f"!! {mode}: {exc!r} on {len(data)} bytes", file=sys.stderr, flush=True)
        if crash_dir:
            os.makedirs(crash_dir, exist_ok=True)
            with open(os.path.join(crash_dir, f"crash-{len(stats.crashes)}.json"), "w") as f:
                json.dump(record, f, indent=1)


def fuzz(inputs: int | None, seconds: float | None, seed: int = 1, *, crash_dir: str | None = None,
         progress: float | None = None, modes: tuple[str, ...] = MODES) -> tuple[Stats, float]:
    rnd = random.Random(seed)
    keyring = Keyring.single(KEY)
    pool = corpus(rnd)
    signed = [keyring.sign(d) for d in pool]
    stats = Stats()
    started = time.perf_counter()
    last = started
    while True:
        if inputs is not None and stats.inputs >= inputs:
            break
        if seconds is not None and stats.inputs % 256 == 0 and time.perf_counter() - started >= seconds:
            break
        mode = modes[stats.inputs % len(modes)]
        roll = rnd.random()
        source = signed if mode == "keyed" and rnd.random() < 0.7 else pool
        if roll < 0.08:
            data = rnd.randbytes(rnd.choice((1, 2, 15, 16, 17, 64, 1000)))
        elif roll < 0.12:  # valid, to keep the happy path in the mix
            data = rnd.choice(source)
        else:
            data = mutate(rnd.choice(source), rnd, source)
            if mode == "keyed" and rnd.random() < 0.5:
                try:
                    data = keyring.sign(data)  # a mutated body with a valid tag: fuzz past the check
                except ValueError:
                    pass  # not whole messages any more
        if mode == "stream":
            data = (wire.Deflater().compress(data) if rnd.random() < 0.7
                    else mutate(wire.Deflater().compress(rnd.choice(pool)), rnd, pool))
        stats.by_mode[mode] += 1
        run_one(data, mode, rnd, keyring, stats, crash_dir)
        stats.inputs += 1
        if progress and stats.inputs % 4096 == 0 and time.perf_counter() - last >= progress:
            last = time.perf_counter()
            el = last - started
            print(f"{stats.inputs:,} inputs, {stats.inputs / el:,.0f}/s, {len(stats.crashes)} crashes, "
                  f"max buffered {stats.max_buffered:,} B", flush=True)
    return stats, time.perf_counter() - started


def report(stats: Stats, elapsed: float) -> str:
    lines = [
        f"inputs:            {stats.inputs:,} in {elapsed:,.1f} s = {stats.inputs / max(elapsed, 1e-9):,.0f} inputs/s",
        "  by decoder:      " + ", ".join(f"{m} {n:,}" for m, n in sorted(stats.by_mode.items())),
        f"decoded to the end: {stats.clean:,} inputs ({stats.messages:,} messages returned in all)",
        "ProtocolError:     " + ", ".join(f"{r} {n:,}" for r, n in stats.reasons.most_common()),
        f"other exceptions:  {len(stats.crashes)}",
        f"largest buffer:    {stats.max_buffered:,} bytes (bound: 16 + {MAX_FRAME:,} + 255); most pending "
        f"{stats.max_pending:,} bytes",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", type=int, help="stop after this many inputs")
    p.add_argument("--minutes", type=float, help="stop after this many minutes")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--mode", choices=MODES, action="append", help="decoder configuration(s) (default: all three)")
    p.add_argument("--crash-dir", default="fuzz-crashes", help="where inputs that crashed are written")
    p.add_argument("--progress", type=float, default=30.0, metavar="S", help="a progress line every S seconds")
    p.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    args = p.parse_args(argv)
    if args.inputs is None and args.minutes is None:
        args.inputs = 100_000
    stats, elapsed = fuzz(args.inputs, args.minutes * 60 if args.minutes else None, args.seed,
                          crash_dir=args.crash_dir, progress=args.progress, modes=tuple(args.mode or MODES))
    print(report(stats, elapsed))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"inputs": stats.inputs, "seconds": elapsed, "inputs_per_s": stats.inputs / elapsed,
                       "clean": stats.clean, "messages": stats.messages, "reasons": dict(stats.reasons),
                       "crashes": len(stats.crashes), "max_buffered": stats.max_buffered,
                       "max_pending": stats.max_pending, "seed": args.seed}, f, indent=1)
    return 1 if stats.crashes else 0


if __name__ == "__main__":
    sys.exit(main())
