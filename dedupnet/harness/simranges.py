"""The ranges of ``dedupnet sim``'s counts and sizes, checked before anything starts, so
that a number out of range is one clear line and exit status 2, not a traceback from
deep inside a run (``--networks 0`` used to divide by zero while dealing the seeds)."""

from __future__ import annotations

import math

__all__ = ["DEFAULT_TIMEOUT", "MAX_HOSTS", "MAX_NETWORKS", "check_ranges"]

#: Seconds a run gets when ``--timeout`` is not given and its politeness bound is short.
DEFAULT_TIMEOUT = 120.0
#: Network L's center is 127.0.L.1 and its hosts 127.0.L.10, .11, ...: L is one octet,
#: and a network's last host is 127.0.L.254.
MAX_NETWORKS = 255
MAX_HOSTS = 245
#: Sites: the synthetic web's address plan (250 a /24, 256 of them).
MAX_SITES = 250 * 256

#: (flag, config field, smallest, largest, whether the smallest is allowed): counts are
#: whole numbers, sizes and times may be fractions; None: no limit that side.
_RANGES = (
    ("--networks", "networks", 1, MAX_NETWORKS, True),
    ("--hosts", "hosts", 1, MAX_HOSTS, True),
    ("--sites", "sites", 1, MAX_SITES, True),
    ("--seeds", "seeds", 1, None, True),
    ("--max-depth", "max_depth", 0, None, True),
    ("--set-size", "set_size", 1, None, True),
    ("--answer-timeout", "answer_timeout", 0, None, False),
    ("--send-delay", "send_delay", 0, None, True),
    ("--timeout", "timeout", 0, None, False),
    ("--windows", "windows", 1, None, True),
    ("--recrawl-after", "recrawl_after", 0, None, False),
    ("--bloom-capacity", "bloom_capacity", 1, None, True),
    ("--bloom-error-rate", "bloom_error_rate", 0, 1, False),
    ("--concurrency", "concurrency", 1, None, True),
    ("--per-site", "per_site_concurrency", 0, None, True),
    ("--per-site-delay", "per_site_delay", 0, None, True),
    ("--web-latency", "web_latency", 0, None, True),
)
#: Flags of the command itself, not of the run's config.
_ARG_RANGES = (
    ("--chaos", "chaos", 1, None, True),
    ("--redis-cluster", "redis_cluster", 1, None, True),
)


def _out_of_range(flag: str, value, low, high, low_ok: bool) -> str | None:
    if value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{flag} must be a finite number, not {value}"
    above = f">= {low}" if low_ok else f"> {low}"
    if (value < low if low_ok else value <= low) or (high is not None and value > high):
        wanted = above if high is None else f"{above} and <= {high}"
        if high is not None and not low_ok:
            wanted = f"between {low} and {high}"
        return f"{flag} must be {wanted}, not {value:g}"
    return None


def check_ranges(args, cfg) -> None:
    """ValueError (one line: the flag, what it must be, what it was) for the first count
    or size of ``dedupnet sim`` out of its range. ``--pages`` must leave every site its
    home page and the web's special pages: at least ``--sites`` + 20."""
    for flag, name, low, high, low_ok in _RANGES:
        problem = _out_of_range(flag, getattr(cfg, name), low, high, low_ok)
        if problem:
            raise ValueError(problem)
    for flag, name, low, high, low_ok in _ARG_RANGES:
        problem = _out_of_range(flag, getattr(args, name, None), low, high, low_ok)
        if problem:
            raise ValueError(problem)
    if cfg.pages < cfg.sites + 20:
        raise ValueError(f"--pages must be at least --sites + 20 ({cfg.sites + 20}), not {cfg.pages}")
