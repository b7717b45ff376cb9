"""Compare: dedupnet.codec.urls.normalize vs URL libraries (hand-written vs library).

Candidates (each is called as it is, with the least glue a switch would need: a
result whose scheme is not http/https counts as a rejection, and the fragment is cut
where the library keeps it):

* ``w3lib.canonicalize_url``   Scrapy's canonical form (the request fingerprint's);
* ``w3lib.safe_url_string``    Scrapy's "make it safe to request" (not a normaliser);
* ``ada_url.normalize_url``    the WHATWG URL parser (ada, C++), as browsers see a URL;
* ``url_normalize``            RFC 3986 normalisation, pure Python.

Prints, for each candidate, how it does on the project's own URL expectations:
``dedupnet/harness/url_cases.py`` ``NORMALISED`` (raw -> our canonical form) and ``REJECTED``
(URLs we refuse, with a reason), whether its output is a fixed point, and the URLs of
the conformance vectors; every differing URL is listed (``--quiet`` for counts only).
Then speed, in URLs/s, on a realistic list: every link of the synthetic web
(``dedupnet/harness/web.py``, 3,000 pages) as the crawler hands it to ``URLGate`` (resolved
against the page or its ``<base href>``, un-normalised: upper-case schemes, dot
segments, escaped unreserved characters), and how many of those URLs would get a
canonical form other than ours, i.e. another fingerprint.

Installs nothing: ``.venv/bin/pip install w3lib ada-url url-normalize`` first (none is
a dependency). Run: ``.venv/bin/python bench/compare_url_libs.py [--quiet] [--pages N]``.
Timings depend on the machine and its load; compare within one run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ada_url  # noqa: E402
import url_normalize  # noqa: E402
import w3lib.url  # noqa: E402

from dedupnet.codec.errors import BadURL  # noqa: E402
from dedupnet.codec.urls import normalize  # noqa: E402
from dedupnet.harness.web import SyntheticWeb, WebSpec  # noqa: E402
from local_host.crawler.links import extract_links  # noqa: E402
from dedupnet.harness.url_cases import NORMALISED, REJECTED  # noqa: E402

REJECT = "<rejected>"


def _glue(fn: Callable[[str], str | None]) -> Callable[[str], str]:
    """A candidate as a drop-in for ``normalize``: its output, or REJECT when it raises,
    returns nothing, or returns a URL whose scheme is not http(s); fragment cut."""
    def call(url: str) -> str:
        try:
            out = fn(url)
        except Exception:  # noqa: BLE001 -- any failure of the library is a rejection here
            return REJECT
        if not out or out.split(":", 1)[0].lower() not in ("http", "https"):
            return REJECT
        return out.split("#", 1)[0]
    return call


def ours(url: str) -> str:
    try:
        return normalize(url)
    except BadURL:
        return REJECT


CANDIDATES: dict[str, Callable[[str], str | None]] = {
    "w3lib.canonicalize_url": w3lib.url.canonicalize_url,
    "w3lib.safe_url_string": w3lib.url.safe_url_string,
    "ada_url.normalize_url": ada_url.normalize_url,
    "url_normalize": url_normalize.url_normalize,
}
VERSIONS = {"w3lib": version("w3lib"), "ada-url": version("ada-url"), "url-normalize": version("url-normalize")}


def vector_urls() -> list[str]:
    found: set[str] = set()
    for path in sorted((ROOT / "tests/conformance/vectors").glob("*.json")):
        found.update(re.findall(r'"(https?://[^"]*)"', path.read_text()))
    return sorted(found)


def web_links(pages: int) -> list[str]:
    """Every link of a synthetic web as the crawler extracts it (before URLGate)."""
    web = SyntheticWeb(WebSpec(pages=pages, sites=max(1, pages // 100), seed=1), port=8077)
    out: list[str] = []
    for i in range(pages):
        body = web._body(i)
        if body.lstrip()[:1] == b"<" and len(body) < 1_000_000:
            out += extract_links(body.decode("utf-8", "replace"), web.url(i)).urls
    return out


def conformance(name: str, fn: Callable[[str], str], quiet: bool) -> dict[str, int]:
    diffs: list[str] = []
    norm_bad = 0
    for raw, want in NORMALISED:
        got = fn(raw)
        if got != want:
            norm_bad += 1
            diffs.append(f"    {raw!r:58} ours {want!r}  it {got!r}")
    rej_bad = 0
    for raw, reason in REJECTED:
        got = fn(raw)
        if got != REJECT:
            rej_bad += 1
            diffs.append(f"    {raw!r:58} ours rejects ({reason})  it {got!r}")
    fixed_bad = sum(1 for _, want in NORMALISED if (out := fn(want)) != REJECT and fn(out) != out)
    vec = vector_urls()
    vec_bad = sum(1 for u in vec if fn(u) != ours(u))
    print(f"  {name:<24} NORMALISED {len(NORMALISED) - norm_bad:>3}/{len(NORMALISED)} equal   "
          f"REJECTED {len(REJECTED) - rej_bad:>3}/{len(REJECTED)} rejected   not idempotent {fixed_bad}   "
          f"vector URLs {len(vec) - vec_bad}/{len(vec)} equal")
    if not quiet and diffs:
        print("\n".join(diffs))
    return {"normalised_differ": norm_bad, "accepts_rejected": rej_bad, "not_idempotent": fixed_bad, "vectors_differ": vec_bad}


def speeds(fns: dict[str, Callable[[str], object]], urls: list[str], repeat: int) -> dict[str, float]:
    """URLs/s of each function alone (a URL it raises on counts, as a rejection does),
    best of ``repeat`` passes interleaved, so a change of load hits every one alike."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            t = time.perf_counter()
            for u in urls:
                try:
                    fn(u)
                except Exception:  # noqa: BLE001, S112
                    continue
            best[name] = min(best[name], time.perf_counter() - t)
    return {name: len(urls) / t for name, t in best.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=3000, help="pages of the synthetic web (default 3,000)")
    ap.add_argument("--repeat", type=int, default=5, help="timed passes; the best is printed")
    ap.add_argument("--quiet", action="store_true", help="counts only, no list of differing URLs")
    ap.add_argument("--json", help="write the counts and rates here")
    args = ap.parse_args()
    print(f"Python {sys.version.split()[0]}; " + ", ".join(f"{k} {v}" for k, v in VERSIONS.items()))

    print("== the project's URL expectations (dedupnet/harness/url_cases.py, conformance vectors) ==")
    results: dict[str, dict] = {"ours": conformance("ours (dedupnet.codec.urls)", ours, args.quiet)}
    for name, fn in CANDIDATES.items():
        results[name] = conformance(name, _glue(fn), args.quiet)

    links = web_links(args.pages)
    canon = [ours(u) for u in links]
    print(f"== the synthetic web's links: {len(links):,} URLs ({len(set(links)):,} distinct), "
          f"best of {args.repeat} passes ==")
    rates = speeds({"ours": normalize, **CANDIDATES}, links, args.repeat)
    rate = results["ours"]["urls_per_s"] = rates["ours"]
    print(f"  {'ours (dedupnet.codec.urls)':<24} {rate:>10,.0f} URLs/s")
    for name, fn in CANDIDATES.items():
        r = rates[name]
        glued = _glue(fn)
        differ = {u: (c, g) for u, c in zip(links, canon) if (g := glued(u)) != c}
        n_differ = sum(1 for u in links if u in differ)
        results[name].update(urls_per_s=r, web_differ=n_differ)
        print(f"  {name:<24} {r:>10,.0f} URLs/s ({r / rate:.2f}x ours, library call alone)   "
              f"another canonical form for {n_differ:,} of {len(links):,} URLs")
        for u, (c, g) in list(differ.items())[: 0 if args.quiet else 2]:
            print(f"    {u[:70]!r}  ours {c[:70]!r}  it {g[:70]!r}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
