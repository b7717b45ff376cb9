"""Bounds on glibc's malloc, set once when a daemon starts (:func:`bound`).

Why: over a long crawl a host daemon's live Python objects stay flat (tracemalloc) while
its RSS creeps up in the C heap's free memory (docs/BENCHMARKS.md, "Soak: RSS over a long
run"). Two glibc defaults make that:

* **An arena per thread.** A thread's first ``malloc`` gets it an arena of its own (a
  heap reserved 64 MiB at a time), one a thread that ended left, or a new one while there
  are fewer than 8 per core: as many arenas as threads were ever alive at once, never
  given back. A host runs worker threads (``trio.to_thread``: the
  Redis calls still made through ``AsyncStore.run``, ``decode_html`` and
  ``extract_links`` on big pages, the page writer), and trio's thread cache ends a
  thread idle for 10 s and starts another when work comes: a 3 x 3 soak's hosts ended
  with 7 to 9 arenas, whose resident memory kept creeping. ``M_ARENA_MAX`` 2 keeps the main arena and one other for every thread (the GIL
  serialises most of their allocations anyway).
* **A sliding mmap threshold.** A freed block that had been mapped on its own raises the
  threshold to its size (up to 32 MiB), and the trim threshold to twice that, so later
  blocks of that size come from the heap, where freeing them leaves holes and a top that
  is not given back below the raised trim threshold. ``M_MMAP_THRESHOLD`` and
  ``M_TRIM_THRESHOLD`` fixed at glibc's starting values (128 KiB) turn the sliding off: a
  response body or a reply of 128 KiB or more is mapped and unmapped on its own. It
  matters most with fewer arenas: ``M_ARENA_MAX`` 2 alone, in the same soak, left the
  main heap 23-34 MB with 9-19 MB of it free, and RSS higher than without it.

Not glibc (musl, macOS, Windows): nothing is done. A bound the operator gives in the
environment (``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``
or ``glibc.malloc.*`` in ``GLIBC_TUNABLES``) is left as given.
"""

from __future__ import annotations

import ctypes
import os

#: mallopt(3) parameters.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

#: What :func:`bound` sets: parameter, value, and the environment variable and tunable
#: by which an operator sets it instead.
BOUNDS = (
    ("arena_max", M_ARENA_MAX, 2, "MALLOC_ARENA_MAX", "glibc.malloc.arena_max"),
    ("mmap_threshold", M_MMAP_THRESHOLD, 128 * 1024, "MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold"),
    ("trim_threshold", M_TRIM_THRESHOLD, 128 * 1024, "MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold"),
)


def glibc() -> ctypes.CDLL | None:
    """This process's C library if it is glibc, else None."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc's own symbol: musl and others have mallopt too
        return libc
    except (OSError, AttributeError):
        return None


def bound(environ: dict[str, str] | None = None) -> dict[str, int]:
    """Set :data:`BOUNDS` in this process's malloc; call it before the daemon starts
    threads. Returns what was set (name to value): empty when not glibc."""
    libc = glibc()
    if libc is None:
        return {}
    env = os.environ if environ is None else environ
    tunables = env.get("GLIBC_TUNABLES", "")
    done = {}
    for name, param, value, variable, tunable in BOUNDS:
        if variable in env or tunable in tunables:
            continue
        if libc.mallopt(param, value) == 1:
            done[name] = value
    return done
