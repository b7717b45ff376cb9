"""Compare: dedupnet.adapters.monitor.metrics.Counters vs prometheus-client (hand-written vs library).

Prints, for the same series:

* equivalence: what our renderer's test expects (``dedupnet/harness/prometheus_text.py``:
  its strict reader and its reference scrape) applied to prometheus-client's output,
  in two ways of using it:
  ``native`` (its ``Counter``/``Gauge`` objects, which a switch would mean) and
  ``collector`` (our registry kept, only the text rendered by ``generate_latest``
  through a custom collector); then the samples of both outputs side by side, parsed
  by prometheus-client's own parser;
* render time of one scrape, at the series count a daemon has (``--series``, 40: a
  center or host of ``dedupnet sim`` has 29-41) and at 1,000;
* the cost of one ``inc`` (labelled and unlabelled; the library's ``labels()`` lookup
  per call, as our call sites would do, and a pre-bound child), single-threaded and
  with two threads incrementing at once (our lock, the library's per-child lock);
* import time on top of trio (fresh interpreters, best of ``--imports``);
* memory of a registry of 1,000 series (tracemalloc).

Installs nothing: ``.venv/bin/pip install prometheus-client`` first (not a dependency).
Run: ``.venv/bin/python bench/compare_metrics.py [--series N] [--quick]``.
Timings depend on the machine and its load; compare within one run.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import threading
import time
import timeit
import tracemalloc
from importlib.metadata import version
from pathlib import Path

os.environ.setdefault("PROMETHEUS_DISABLE_CREATED_SERIES", "true")  # no *_created samples: ours has none

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client import Counter as PCounter  # noqa: E402
from prometheus_client.core import Metric  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from dedupnet.adapters.monitor.metrics import Counters, render_prometheus  # noqa: E402
from import_cost import line  # noqa: E402
from dedupnet.harness.prometheus_text import REFERENCE, parse_prometheus, reference_counters  # noqa: E402

PREFIX = "dedupnet_"

# Series shaped like a daemon's (names and label sets from dedupnet/adapters/net/transport/ and the
# cores); the count is reached by widening the label values.
_SHAPES = [
    ("frames_received", ("kind",)), ("frames_acked", ("kind", "flag")), ("frames_sent", ("kind",)),
    ("frames_in", ("stage", "flag")), ("bad_input", ("reason",)), ("handshake_failed", ("reason",)),
    ("sent_bytes", ()), ("received_bytes", ()), ("connected", ()), ("pages_fetched", ("status",)),
]


def series(n: int) -> list[tuple[str, dict[str, str]]]:
    out: list[tuple[str, dict[str, str]]] = []
    for i in itertools.count():
        for name, labels in _SHAPES:
            if len(out) == n:
                return out
            if labels or i == 0:
                out.append((name, {k: f"{k}{i}" for k in labels}))


# --- the library, used natively --------------------------------------------------------

class Native:
    """prometheus-client's own objects: one Counter per name with fixed label names."""

    def __init__(self, shapes: list[tuple[str, dict[str, str]]]):
        self.registry = CollectorRegistry()
        self.metrics: dict[str, PCounter] = {}
        for name, labels in shapes:
            if name not in self.metrics:
                self.metrics[name] = PCounter(PREFIX + name, name, list(labels), registry=self.registry)
            m = self.metrics[name]
            (m.labels(**labels) if labels else m).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class OurCollector:
    """The other way: keep ``Counters``, let the library write the text (a custom collector)."""

    def __init__(self, counters: Counters):
        self.counters = counters
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def collect(self):
        c = self.counters
        with c._lock:
            groups = [("counter", sorted(c._counters.items())), ("gauge", sorted(c._gauges.items()))]
            display = dict(c._display)
        for kind, items in groups:
            for name, group in itertools.groupby(items, key=lambda kv: kv[0][0]):
                m = Metric(PREFIX + name.removesuffix("_total"), name, kind)
                for key, value in group:
                    m.add_sample(m.name + ("_total" if kind == "counter" else ""), dict(display[key]), value)
                yield m

    def render(self) -> bytes:
        return generate_latest(self.registry)


# --- equivalence ----------------------------------------------------------------------

def test_expectations(text: str) -> str:
    """What our renderer's test expects of the reference scrape, on ``text``."""
    try:
        metrics = parse_prometheus(text)
    except ValueError as e:
        return f"FAIL: the strict reader refuses it: {str(e)[:70]}"
    wrong = [name for name, want in REFERENCE.items() if metrics.get(name) != want]
    if wrong:
        return f"FAIL: {wrong[0]} is {metrics.get(wrong[0])}"
    return "pass"


def samples(text: str) -> set[tuple]:
    return {(s.name, tuple(sorted(s.labels.items())), s.value)
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def native_sample_counters() -> tuple[str | None, str]:
    """``reference_counters()`` written with the library's own objects, if it can be."""
    reg = CollectorRegistry()
    try:
        frames = PCounter(PREFIX + "frames_received", "frames", ["kind", "flag"], registry=reg)
        frames.labels(kind="frame", flag="1").inc()
        frames.labels(flag="1", kind="frame").inc(4)
        frames.labels(kind="register").inc()  # our call sites do this: a second label set
    except ValueError as e:
        return None, f"ValueError: {e}"
    return generate_latest(reg).decode(), "ok"


def equivalence() -> None:
    print("== equivalence (the reference scrape of dedupnet/harness/prometheus_text.py) ==")
    ours = reference_counters()
    text = render_prometheus(ours)
    print(f"  ours                       {test_expectations(text)}")
    native, why = native_sample_counters()
    print(f"  library, native objects    {'cannot express the series: ' + why if native is None else test_expectations(native)}")
    lib = OurCollector(ours).render().decode()
    print(f"  library, custom collector  {test_expectations(lib)}")
    no_help = "".join(line for line in lib.splitlines(keepends=True) if not line.startswith("# HELP"))
    print(f"    the same without # HELP  {test_expectations(no_help)}")
    a, b = samples(text), samples(lib)
    print(f"  samples equal (library's parser on both): {a == b} ({len(a)} samples)")
    ours_lines, lib_lines = set(text.splitlines()), set(lib.splitlines())
    print("  lines only in the library's text:")
    for text_line in sorted(lib_lines - ours_lines):
        print(f"    + {text_line}")
    print("  lines only in ours:")
    for text_line in sorted(ours_lines - lib_lines):
        print(f"    - {text_line}")


# --- speed and memory -------------------------------------------------------------------

def best(fns: dict[str, object], number: int, repeat: int) -> dict[str, float]:
    """Seconds per call of each, best of ``repeat`` runs interleaved (load hits all alike)."""
    out = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            out[name] = min(out[name], timeit.timeit(fn, number=number) / number)
    return out


def render_times(n: int, repeat: int) -> None:
    shapes = series(n)
    ours = Counters()
    for name, labels in shapes:
        ours.inc(name, **labels)
    native = Native(shapes)
    coll = OurCollector(ours)
    assert samples(render_prometheus(ours)) == samples(native.render().decode()) == samples(coll.render().decode())
    number = max(10, 20_000 // n)
    t = best({"ours": lambda: render_prometheus(ours), "native": native.render, "collector": coll.render}, number, repeat)
    t_ours, t_native, t_coll = t["ours"], t["native"], t["collector"]
    size = len(render_prometheus(ours))
    print(f"  {n:>5} series ({size:>6,} bytes)   ours {t_ours * 1e6:>8,.0f} µs   library native "
          f"{t_native * 1e6:>8,.0f} µs ({t_native / t_ours:.1f}x)   library over our registry "
          f"{t_coll * 1e6:>8,.0f} µs ({t_coll / t_ours:.1f}x)")


def inc_costs(repeat: int) -> dict[str, float]:
    ours = Counters()
    reg = CollectorRegistry()
    frames = PCounter(PREFIX + "frames_received", "", ["kind", "flag"], registry=reg)
    sent = PCounter(PREFIX + "sent_bytes", "", registry=reg)
    child = frames.labels(kind="frame", flag="1")
    n = 100_000
    return best({
        "ours inc(name, kind=, flag=)": lambda: ours.inc("frames_received", kind="frame", flag="1"),
        "library .labels(kind=, flag=).inc()": lambda: frames.labels(kind="frame", flag="1").inc(),
        "library pre-bound child .inc()": child.inc,
        "ours inc(name, 1234)": lambda: ours.inc("sent_bytes", 1234),
        "library .inc(1234)": lambda: sent.inc(1234),
    }, n, repeat)


def contended(repeat: int) -> tuple[float, float]:
    """ns per labelled inc with two threads incrementing the same series at once."""
    ours = Counters()
    frames = PCounter(PREFIX + "frames_received", "", ["kind", "flag"], registry=CollectorRegistry())
    n = 100_000

    def run(fn) -> float:
        def work():
            for _ in range(n):
                fn()
        times = []
        for _ in range(repeat):
            threads = [threading.Thread(target=work) for _ in range(2)]
            t = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            times.append(time.perf_counter() - t)
        return min(times) / (2 * n)

    a = run(lambda: ours.inc("frames_received", kind="frame", flag="1"))
    b = run(lambda: frames.labels(kind="frame", flag="1").inc())
    assert ours.get("frames_received", kind="frame", flag="1") == 2 * n * repeat
    return a, b


def memory(n: int) -> tuple[int, int]:
    shapes = series(n)
    tracemalloc.start()
    ours = Counters()
    for name, labels in shapes:
        ours.inc(name, **labels)
    a = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    tracemalloc.start()
    native = Native(shapes)
    b = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del ours, native
    return a, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--series", type=int, default=40, help="series of a typical daemon (default 40)")
    ap.add_argument("--imports", type=int, default=7, help="fresh interpreters per import figure")
    ap.add_argument("--quick", action="store_true", help="one repeat of each figure (a smoke run)")
    args = ap.parse_args()
    repeat = 1 if args.quick else 5
    print(f"prometheus-client {version('prometheus-client')}; Python {sys.version.split()[0]}; {os.cpu_count()} cores")
    equivalence()

    print("== render one scrape (best of %d) ==" % repeat)
    for n in dict.fromkeys([args.series, 1000]):
        render_times(n, repeat)

    print("== one inc (best of %d, single thread) ==" % repeat)
    for what, t in inc_costs(repeat).items():
        print(f"  {what:<40} {t * 1e9:>6,.0f} ns")
    a, b = contended(1 if args.quick else 3)
    print(f"  two threads at once, labelled: ours {a * 1e9:,.0f} ns, library {b * 1e9:,.0f} ns per inc")

    tries = 1 if args.quick else args.imports
    print(f"== import on top of trio (best of {tries} fresh interpreters) ==")
    print("  " + line(["dedupnet.adapters.monitor.metrics", "prometheus_client"], tries))

    a, b = memory(1000)
    print("== memory of 1,000 series (tracemalloc) ==")
    print(f"  ours {a / 1024:,.0f} KiB   library native {b / 1024:,.0f} KiB ({b / a:.1f}x)")


if __name__ == "__main__":
    main()
