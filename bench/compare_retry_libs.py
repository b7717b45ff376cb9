"""Compare: dedupnet's hand-written retries vs tenacity, stamina, backoff.

Where dedupnet retries (each with its own loop, for reasons in docs/DECISIONS.md):

* ``Store._with_retry`` (dedupnet/adapters/storage/store.py) and ``AsyncStore.execute`` (dedupnet/adapters/storage/aio.py):
  every Redis round trip, 6 attempts from 50 ms doubling to 2 s, then ``StoreUnavailable``;
* ``redis_cluster.run_commands`` / ``_transaction``: the same policy, but the waits are
  yielded (``Pause``) by a sans-I/O plan to whichever driver runs it, sync or trio;
* ``runtime.until_stored``: a daemon's store call, for ever, logging once per 10 s;
* ``transport.connect_forever``: reconnect with jitter, a back-off reset by a session
  that lasted, failures counted and logged once per interval with their number.

For each library this prints: whether its async retry runs under trio at all, and on
trio's ``MockClock`` (it must sleep with ``trio.sleep``, or virtual time would not
move); the delays it waits for our policy; and what it costs per call that succeeds at
once, which is nearly every call (best of ``--repeat``; a Redis round trip costs the
client 79-93 µs, docs/DECISIONS.md "Store"). And import time on top of trio.

Installs nothing: ``.venv/bin/pip install tenacity stamina backoff`` first (none is a
dependency). Run: ``.venv/bin/python bench/compare_retry_libs.py [--quick]``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import timeit
import types
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import trio
import trio.testing

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import backoff  # noqa: E402
import stamina  # noqa: E402
import tenacity  # noqa: E402

from dedupnet.codec.errors import StoreUnavailable  # noqa: E402
from dedupnet.adapters.storage.store import STORE_RETRY, Store  # noqa: E402
from import_cost import line  # noqa: E402

POLICY = STORE_RETRY  # 6 attempts, 0.05 s doubling, capped at 2 s
logging.getLogger("dedupnet.adapters.storage.store").setLevel(logging.ERROR)  # the retry warnings
logging.getLogger("stamina").setLevel(logging.ERROR)
stamina.instrumentation.set_on_retry_hooks([])  # no per-retry log lines in the figures


# --- the same policy in each library ----------------------------------------------------

def tenacity_retry(fn):
    return tenacity.retry(retry=tenacity.retry_if_exception_type(OSError),
                          wait=tenacity.wait_exponential(multiplier=POLICY.first, max=POLICY.cap),
                          stop=tenacity.stop_after_attempt(POLICY.attempts), reraise=True)(fn)


def stamina_retry(fn):
    return stamina.retry(on=OSError, attempts=POLICY.attempts, wait_initial=POLICY.first,
                         wait_max=POLICY.cap, wait_jitter=0, timeout=None)(fn)


def backoff_retry(fn):
    return backoff.on_exception(backoff.expo, OSError, max_tries=POLICY.attempts, factor=POLICY.first,
                                max_value=POLICY.cap, jitter=None)(fn)


LIBS: dict[str, Callable] = {"tenacity": tenacity_retry, "stamina": stamina_retry, "backoff": backoff_retry}


async def ours_async(fn):
    """The loop of ``AsyncStore.execute`` (dedupnet/adapters/storage/aio.py), around ``fn``."""
    delays = POLICY.delays()
    while True:
        try:
            return await fn()
        except OSError as e:
            delay = next(delays, None)
            if delay is None:
                raise StoreUnavailable(str(e)) from e
            await trio.sleep(delay)


def ours_sync(fn):
    """``Store._with_retry`` itself, on a stand-in for the store."""
    store = types.SimpleNamespace(retry=POLICY, url="redis://bench", reconnects=0)
    return Store._with_retry(store, fn)


# --- behaviour on trio ------------------------------------------------------------------

def failing(times: int):
    calls = {"n": 0}

    async def fn():
        calls["n"] += 1
        if calls["n"] <= times:
            raise OSError("connection refused")
        return calls["n"]
    return fn


def on_mock_clock(wrap: Callable | None, fails: int) -> str:
    """Run a call that fails ``fails`` times on a MockClock; say what happened."""
    async def main():
        fn = failing(fails)
        t0 = trio.current_time()
        try:
            result = await (ours_async(fn) if wrap is None else wrap(fn)())
        except (OSError, StoreUnavailable) as e:
            return f"gave up ({type(e).__name__}) after {trio.current_time() - t0:.2f} s of trio time"
        return f"call {result} succeeded after {trio.current_time() - t0:.2f} s of trio time"
    try:
        return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    except Exception as e:  # noqa: BLE001
        return f"does not run on trio: {type(e).__name__}: {e}"


# --- cost of a call that succeeds at once --------------------------------------------------

def per_call(stmt: Callable[[], object], number: int, repeat: int) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number


def async_per_call(wrap: Callable | None, number: int, repeat: int) -> float:
    async def ok():
        return 1
    wrapped = None if wrap is None else wrap(ok)

    async def main():
        best = float("inf")
        for _ in range(repeat):
            t = trio.current_time()
            if wrapped is None:
                for _ in range(number):
                    await ours_async(ok)
            else:
                for _ in range(number):
                    await wrapped()
            best = min(best, trio.current_time() - t)
        return best / number
    return trio.run(main)  # trio's clock: real monotonic time here


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="fewer calls, one repeat (a smoke run)")
    args = ap.parse_args()
    repeat = 1 if args.quick else args.repeat
    number = 2_000 if args.quick else 20_000
    print(f"Python {sys.version.split()[0]}; trio {trio.__version__}; "
          + ", ".join(f"{m} {version(m)}" for m in LIBS))

    print("== on trio's MockClock: fails twice, then succeeds (ours waits 0.05 + 0.10 s) ==")
    print(f"  {'ours':<9} {on_mock_clock(None, 2)}")
    for name, wrap in LIBS.items():
        print(f"  {name:<9} {on_mock_clock(wrap, 2)}")
    print("== never succeeds (ours: 6 attempts, 0.05+0.1+0.2+0.4+0.8 = 1.55 s, then StoreUnavailable) ==")
    print(f"  {'ours':<9} {on_mock_clock(None, 99)}")
    for name, wrap in LIBS.items():
        print(f"  {name:<9} {on_mock_clock(wrap, 99)}")

    print(f"== cost of a call that succeeds at once (best of {repeat}) ==")
    def ok():
        return 1
    sync_fns = {"ours": lambda: ours_sync(ok), "bare": ok, **{name: wrap(ok) for name, wrap in LIBS.items()}}
    on_trio = [None, *(w for w in LIBS.values() if "does not run" not in on_mock_clock(w, 2))]
    sync: dict = dict.fromkeys(sync_fns, float("inf"))
    asy: dict = dict.fromkeys([n for n, w in [("ours", None), *LIBS.items()] if w in on_trio], float("inf"))
    for _ in range(repeat):  # interleaved, so a change of load hits every way alike
        for name, fn in sync_fns.items():
            sync[name] = min(sync[name], per_call(fn, number, 1))
        for name in asy:
            asy[name] = min(asy[name], async_per_call(LIBS.get(name), number, 1))
    bare = sync["bare"]
    for name in ["ours", *LIBS]:
        a = f"{asy[name] * 1e6:6.2f} µs" if name in asy else "   n/a   "
        print(f"  {name:<9} sync {(sync[name] - bare) * 1e6:6.2f} µs   trio {a}")

    tries = 1 if args.quick else 5
    print(f"== import on top of trio (best of {tries}) ==")
    print("  " + line(list(LIBS), tries))


if __name__ == "__main__":
    main()
