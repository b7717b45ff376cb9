"""A strict reader of the Prometheus text format, and one reference registry with what it
must read as. The test of our renderer and the comparison with prometheus-client
(bench/compare_metrics.py) check the same scrape the same way: a reader that accepted
what a scraper refuses would prove nothing."""

from __future__ import annotations

import re

from dedupnet.adapters.monitor.metrics import Counters

__all__ = ["REFERENCE", "parse_prometheus", "reference_counters"]

_SAMPLE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*",?)*\})? (\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
_HELP = re.compile(r"# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (\S.*)")
_TYPE = re.compile(r"# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge)")

#: A metric's type and its samples by label set (``((name, value), ...)``).
Scrape = dict[str, tuple[str, dict[tuple, float]]]


def parse_prometheus(text: str) -> Scrape:
    """Every metric of ``text``; ValueError naming the first line a scraper would refuse
    (or that breaks the HELP-then-TYPE-then-samples order we promise)."""
    if not text.endswith("\n"):
        raise ValueError("the text does not end with a newline")
    metrics: Scrape = {}
    current = helped = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            if not (m := _HELP.fullmatch(line)):
                raise ValueError(f"bad HELP line: {line!r}")
            helped = m.group(1)
        elif line.startswith("#"):
            if not (m := _TYPE.fullmatch(line)):
                raise ValueError(f"bad comment line: {line!r}")
            if m.group(1) in metrics:
                raise ValueError(f"second TYPE line for {m.group(1)}")
            if helped != m.group(1):
                raise ValueError(f"no HELP line right before the TYPE line of {m.group(1)}")
            current = m.group(1)
            metrics[current] = (m.group(2), {})
        else:
            if not (m := _SAMPLE.fullmatch(line)):
                raise ValueError(f"bad sample line: {line!r}")
            if m.group(1) != current:
                raise ValueError(f"sample {line!r} not under its TYPE line")
            labels = tuple((k, v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\"))
                           for k, v in _LABEL.findall(m.group(2) or ""))
            metrics[current][1][labels] = float(m.group(3))
    return metrics


def reference_counters() -> Counters:
    """Series of every kind a daemon has: labelled and not, a label value to escape,
    label keywords in another order, counters and gauges."""
    c = Counters()
    c.inc("frames_received", kind="frame", flag="1")
    c.inc("frames_received", 4, flag="1", kind="frame")  # keyword order does not matter
    c.inc("frames_received", kind="register")
    c.inc("bad_input", reason='we"ird\\re\nason')
    c.inc("sent_bytes", 1234)
    c.set_gauge("connections_open", 3, role="host")
    c.set_gauge("load", 0.25)
    return c


#: What :func:`parse_prometheus` reads in the scrape of :func:`reference_counters`.
REFERENCE: Scrape = {
    "dedupnet_frames_received_total": ("counter", {(("kind", "frame"), ("flag", "1")): 5.0,
                                                   (("kind", "register"),): 1.0}),
    "dedupnet_bad_input_total": ("counter", {(("reason", 'we"ird\\re\nason'),): 1.0}),
    "dedupnet_sent_bytes_total": ("counter", {(): 1234.0}),
    "dedupnet_connections_open": ("gauge", {(("role", "host"),): 3.0}),
    "dedupnet_load": ("gauge", {(): 0.25}),
}
