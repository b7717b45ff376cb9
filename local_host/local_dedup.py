"""Local de-dup on a host (paper §2.2): what leaves a host is new to that host.

Pure functions over URLs, fingerprints and look-up results; the caller does the
I/O (one batched ``finish_URL`` look-up per batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LocalReduce:
    """Outcome of §2.2 steps 2-3 for one batch taken from ``URL_pool``."""

    #: The URL_sets to send with flag=1, every value 0 (§2.2 step 3).
    url_sets: list[dict[str, int]]
    #: Indexes into the batch of URLs already in ``finish_URL`` (§2.2 step 2: deleted).
    crawled: list[int]
    #: Indexes of repeats of a URL earlier in the same batch (one copy is kept).
    repeated: list[int]


def local_reduce(urls: Sequence[str], fps: np.ndarray, seen: np.ndarray, set_size: int) -> LocalReduce:
    """Drop URLs ``seen`` (looked up in ``finish_URL``) and repeats within the batch,
    then group the rest, in order, into URL_sets of at most ``set_size``."""
    crawled: list[int] = []
    repeated: list[int] = []
    fresh: list[str] = []
    kept: set[int] = set()
    for i, (url, fp, hit) in enumerate(zip(urls, fps.tolist(), seen.tolist())):
        if hit:
            crawled.append(i)
        elif fp in kept:
            repeated.append(i)
        else:
            kept.add(fp)
            fresh.append(url)
    url_sets = [dict.fromkeys(fresh[i : i + set_size], 0) for i in range(0, len(fresh), set_size)]
    return LocalReduce(url_sets, crawled, repeated)
