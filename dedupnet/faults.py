"""Fault vocabulary (issue #9) — MINIMAL PLACEHOLDER on branch ``faults-link``.

Another branch owns this module (the full vocabulary, process faults, the parser);
this copy holds only the definitions the link relays (:mod:`dedupnet.relay`) code
against, so that the branch runs on its own. The lead reconciles the two.
"""

from __future__ import annotations

from dataclasses import dataclass

LINK_FAULTS = ("partition", "lossy-wan", "lossy-lan", "duplicate-frames")


@dataclass(frozen=True)
class Fault:
    kind: str
    at: float | None = None  # fraction of pages fetched when it starts; None: from the seed
    duration: float | None = None  # seconds; None: the kind's default
    target: str | None = None  # "host:<network>.<index>", "center:<network>", "wan:<a>-<b>"; None: from the seed


def parse_fault(spec: str) -> Fault:
    """``kind[@at][:duration][/target]`` — placeholder syntax for this branch only,
    e.g. ``partition``, ``partition@0.3:10/wan:1-2``, ``lossy-lan/host:1.0``."""
    target = None
    if "/" in spec:
        spec, target = spec.split("/", 1)
    duration = None
    if ":" in spec:
        spec, d = spec.split(":", 1)
        duration = float(d)
    at = None
    if "@" in spec:
        spec, a = spec.split("@", 1)
        at = float(a)
    if spec not in LINK_FAULTS:
        raise ValueError(f"unknown fault {spec!r} (link faults: {', '.join(LINK_FAULTS)})")
    return Fault(spec, at, duration, target)
