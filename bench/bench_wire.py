"""Benchmark: bytes per URL on the wire and codec CPU per URL, plain JSON vs zstd bodies.

Frames are the paper's ``<URL_set, IP, number, flag>`` with URL sets of 20, 100, 400 and
1000 URLs, drawn from two URL populations:

* ``synthetic``: pages of the simulation's synthetic web (``dedupnet/harness/web.py``), shuffled
  so a set mixes sites as a crawler's discoveries do;
* ``realistic``: URLs shaped like a broad crawl's (many hosts, slugs, numeric ids,
  query strings, some random tokens that do not compress).

For each, it prints the bytes per URL of a flag=1 frame (header included) plain and
compressed, the ratio, and the CPU per URL of ``wire.encode`` and of decoding (a fresh
``wire.Decoder`` per frame: parse, decompress, validate), plain and compressed, plus
the cost of compressing already-encoded bytes (what a connection does once per
broadcast). Run: ``.venv/bin/python bench/bench_wire.py [--repeat N]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
import argparse
import random
import string
import time

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.codec import wire  # noqa: E402
from dedupnet.codec.messages import FLAG_NEW_SET, Frame  # noqa: E402
from dedupnet.harness.web import SyntheticWeb, WebSpec  # noqa: E402

SIZES = (20, 100, 400, 1000)
WORDS = ("news world sport business tech science health travel food style culture opinion video live "
         "market economy election climate energy football music film books art review guide best how "
         "why new top city local weather photo gallery report analysis update").split()
TLDS = ("com", "org", "net", "de", "co.uk", "fr", "io", "info", "es", "it", "nl", "jp")


def synthetic_urls(n: int, seed: int) -> list[str]:
    web = SyntheticWeb(WebSpec(pages=max(n, 5000), sites=50))
    urls = [web.url(i) for i in range(max(n, 5000))]
    random.Random(seed).shuffle(urls)
    return urls[:n]


def realistic_urls(n: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    hosts = [f"{rnd.choice(['www.', '', 'blog.', 'shop.', 'm.'])}{rnd.choice(WORDS)}{rnd.choice(WORDS)}"
             f"{rnd.randrange(100) if rnd.random() < 0.3 else ''}.{rnd.choice(TLDS)}" for _ in range(400)]
    out = []
    for _ in range(n):
        host = hosts[int(len(hosts) * rnd.random() ** 2)]  # a few big sites, a long tail
        path = "/".join(rnd.choice(WORDS) for _ in range(rnd.randint(1, 3)))
        roll = rnd.random()
        if roll < 0.4:
            slug = "-".join(rnd.choice(WORDS) for _ in range(rnd.randint(3, 8)))
            url = f"https://{host}/{path}/{slug}-{rnd.randrange(10**5, 10**8)}"
        elif roll < 0.7:
            url = f"https://{host}/{path}/{rnd.randrange(10**6)}.html"
        elif roll < 0.9:
            url = f"https://{host}/{path}?id={rnd.randrange(10**7)}&page={rnd.randint(1, 50)}"
        else:  # tracking tokens, session ids: nearly incompressible
            token = "".join(rnd.choices(string.ascii_letters + string.digits, k=rnd.randint(16, 40)))
            url = f"https://{host}/{path}?utm_source={rnd.choice(WORDS)}&sid={token}"
        out.append(url)
    return out


def per_call(fn, repeat: int) -> float:
    """Seconds per call, best of 3 rounds of ``repeat`` calls (noise on a shared machine)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - t0) / repeat)
    return best


def decode(data: bytes) -> None:
    decoder = wire.Decoder()
    decoder.feed(data)
    decoder.next_message()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=0, help="calls per timing round (default: ~40k URLs' worth)")
    args = ap.parse_args()
    print(f"zstd level {wire.ZSTD_LEVEL}, bodies of at least {wire.COMPRESS_MIN_BODY} bytes compressed; "
          "CPU per URL, best of 3 rounds\n")
    head = (f"{'URLs':>5} {'plain B/URL':>11} {'zstd B/URL':>10} {'ratio':>6} | {'enc plain':>9} {'enc zstd':>8} "
            f"{'dec plain':>9} {'dec zstd':>8} {'recompress':>10}  (us/URL)")
    for name, make in (("synthetic web (dedupnet/harness/web.py)", synthetic_urls), ("realistic crawl URLs", realistic_urls)):
        print(name)
        print(head)
        for n in SIZES:
            urls = make(n, seed=n)
            frame = Frame(dict.fromkeys(urls, 0), "127.0.1.10", 4295098378, FLAG_NEW_SET)
            plain = wire.encode(frame)
            small = wire.encode(frame, compress=True)
            assert wire.decode_one(small) == frame == wire.decode_one(plain)
            repeat = args.repeat or max(20, 40_000 // n)
            us = {
                "enc plain": per_call(lambda: wire.encode(frame), repeat),
                "enc zstd": per_call(lambda: wire.encode(frame, compress=True), repeat),
                "dec plain": per_call(lambda: decode(plain), repeat),
                "dec zstd": per_call(lambda: decode(small), repeat),
                "recompress": per_call(lambda: wire.compressed(plain), repeat),
            }
            us = {k: v * 1e6 / n for k, v in us.items()}
            print(f"{n:>5} {len(plain) / n:>11.1f} {len(small) / n:>10.1f} {len(plain) / len(small):>5.1f}x | "
                  f"{us['enc plain']:>9.2f} {us['enc zstd']:>8.2f} {us['dec plain']:>9.2f} {us['dec zstd']:>8.2f} "
                  f"{us['recompress']:>10.2f}")
        print()
    print("where compression starts to pay (realistic URLs; every body compressed regardless of size)")
    print(f"{'URLs':>5} {'plain body':>10} {'zstd body':>9} {'saved':>6} {'zstd us':>8}")
    for n in (1, 2, 3, 5, 8, 12):
        frame = Frame(dict.fromkeys(realistic_urls(n, seed=7), 0), "127.0.1.10", 4295098378, FLAG_NEW_SET)
        body = wire.encode(frame)[wire.HEADER_SIZE :]
        small = wire._compressor.compress(body)
        cost = per_call(lambda: wire._compressor.compress(body), 2000) * 1e6
        print(f"{n:>5} {len(body):>10} {len(small):>9} {len(body) - len(small):>6} {cost:>8.1f}")


if __name__ == "__main__":
    main()
