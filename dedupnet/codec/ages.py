"""How long a URL counts as seen, under re-crawl by age: the operator's
``recrawl_after`` and ``recrawl_sites`` as a pure rule both roles apply (the centers'
admitted record, the hosts' finish_URL). Storage by age is dedupnet/adapters/storage/recrawl.py;
the argument is docs/PROTOCOL.md, "Re-crawl by age"."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dedupnet.codec.urls import site_of

NEVER = ("never", "off", "inf")


def _label(age: float) -> str:
    """The age as it appears in key names: ``86400``, ``2.5`` (one name per age)."""
    return str(int(age)) if age == int(age) else repr(age)


def _seconds(text: str, what: str) -> float | None:
    if text.strip().lower() in NEVER:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what}: expected seconds or 'never', got {text!r}") from None
    if not 0 < value < math.inf:
        raise ValueError(f"{what}: the age must be positive seconds, got {text!r}")
    return value


@dataclass(frozen=True)
class RecrawlPolicy:
    """How long a URL counts as seen: ``sites`` (``(glob, seconds or None)``, the first
    whose glob matches the URL's site wins), else ``after``; None means for ever."""

    after: float | None = None
    sites: tuple[tuple[str, float | None], ...] = ()

    def __post_init__(self) -> None:
        if self.after is not None and not 0 < self.after < math.inf:
            raise ValueError(f"recrawl_after must be positive seconds, got {self.after!r}")
        object.__setattr__(self, "_by_site", {})

    @classmethod
    def from_settings(cls, after: float | None, sites: Sequence[str] = ()) -> "RecrawlPolicy | None":
        """``recrawl_after`` and ``recrawl_sites`` (``"GLOB=SECONDS"`` or ``"GLOB=never"``
        each); None when no URL ever ages (the daemons then keep today's layout)."""
        parsed = []
        for item in sites:
            glob, sep, value = item.rpartition("=")
            if not sep or not glob.strip():
                raise ValueError(f"recrawl_sites: expected GLOB=SECONDS, got {item!r}")
            parsed.append((glob.strip().lower(), _seconds(value, f"recrawl_sites {item!r}")))
        policy = cls(after, tuple(parsed))
        return policy if policy.active else None

    @property
    def active(self) -> bool:
        return self.after is not None or any(age is not None for _, age in self.sites)

    def age_of(self, url: str) -> float | None:
        """Seconds ``url`` counts as seen after it was admitted or crawled (None: for ever)."""
        if not self.sites:
            return self.after
        try:
            site = site_of(url)
        except ValueError:
            return self.after
        cache: dict[str, float | None] = self._by_site  # type: ignore[attr-defined]
        try:
            return cache[site]
        except KeyError:
            pass
        age = next((a for glob, a in self.sites if fnmatch.fnmatchcase(site, glob)), self.after)
        if len(cache) > 100_000:
            cache.clear()
        cache[site] = age
        return age

    def groups(self, urls: Sequence[str]) -> dict[float | None, np.ndarray]:
        """Positions of ``urls`` by age."""
        if not self.sites:
            return {self.after: np.arange(len(urls))}
        ages: dict[float | None, list[int]] = {}
        for i, url in enumerate(urls):
            ages.setdefault(self.age_of(url), []).append(i)
        return {age: np.array(idx, dtype=np.int64) for age, idx in ages.items()}

    def describe(self) -> str:
        """``"3600 s"``, or ``"news.*: 60 s, others: 3600 s"`` (for the daemons' logs)."""
        def text(age: float | None) -> str:
            return "ever" if age is None else f"{_label(age)} s"
        if not self.sites:
            return text(self.after)
        return ", ".join([f"{g}: {text(a)}" for g, a in self.sites] + [f"others: {text(self.after)}"])
