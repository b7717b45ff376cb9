"""Compare: the simulation's progress line vs tqdm and rich.

``dedupnet sim`` prints one plain line a second (``dedupnet.harness.report.progress_line``):
time, pages fetched and their rate, ``URL_pool``, ``task_pool``, sets in flight,
duplicates. The same 60 samples (a one-minute run) are written here by our line, by a
``tqdm`` bar with those fields as its postfix, and by a ``rich`` progress bar with them
as columns, each into a pipe-like file (what CI, ``make sim | tee`` and the tests see)
and into a file that says it is a terminal. Printed for each: lines and bytes
written, whether the text carries carriage returns or escape sequences, the cost of
one update, and import time on top of trio (fresh interpreters, best of ``--imports``).

Installs nothing: ``.venv/bin/pip install tqdm rich`` first (neither is a dependency).
Run: ``.venv/bin/python bench/compare_progress.py``.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, Progress, TextColumn  # noqa: E402
from tqdm import tqdm  # noqa: E402

from dedupnet.harness.report import progress_line  # noqa: E402
from import_cost import line  # noqa: E402

TOTAL = 3_000  # pages of the default synthetic web


def samples(n: int) -> list[dict]:
    return [{"t": i + 1.0, "pages_fetched": min(TOTAL, 50 * (i + 1)), "duplicates": 0, "URL_pool": 300 - i,
             "task_pool": 90, "reduce_pools": i % 3} for i in range(n)]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def ours(out, rows):
    for s in rows:
        print(progress_line(s), file=out, flush=True)


def with_tqdm(out, rows):
    bar = tqdm(total=TOTAL, file=out, unit="page", mininterval=0, miniters=1)
    for s in rows:
        bar.n = s["pages_fetched"]
        bar.set_postfix(URL_pool=s["URL_pool"], task_pool=s["task_pool"], in_flight=s["reduce_pools"],
                        duplicates=s["duplicates"], refresh=False)
        bar.refresh()
    bar.close()


def with_rich(out, rows):
    console = Console(file=out, width=120)
    columns = [TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.completed}/{task.total} pages  URL_pool {task.fields[url_pool]}  "
                          "task_pool {task.fields[task_pool]}  in flight {task.fields[in_flight]}  "
                          "duplicates {task.fields[duplicates]}")]
    with Progress(*columns, console=console, auto_refresh=False) as progress:
        task = progress.add_task("crawl", total=TOTAL, url_pool=0, task_pool=0, in_flight=0, duplicates=0)
        for s in rows:
            progress.update(task, completed=s["pages_fetched"], url_pool=s["URL_pool"], task_pool=s["task_pool"],
                            in_flight=s["reduce_pools"], duplicates=s["duplicates"])
            progress.refresh()


WAYS = {"ours (print)": ours, "tqdm": with_tqdm, "rich": with_rich}


def describe(text: str) -> str:
    lines = text.count("\n")
    flags = [f for f, c in (("CR", "\r"), ("ESC", "\x1b")) if c in text]
    return f"{lines:>3} lines {len(text.encode()):>7,} bytes  {'+'.join(flags) or 'plain text':<10}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=60)
    ap.add_argument("--imports", type=int, default=5)
    args = ap.parse_args()
    rows = samples(args.samples)
    print(f"Python {sys.version.split()[0]}; tqdm {version('tqdm')}, rich {version('rich')}; {len(rows)} updates")
    for name, way in WAYS.items():
        pipe, tty = io.StringIO(), Terminal()
        t = time.perf_counter()
        way(pipe, rows)
        per_update = (time.perf_counter() - t) / len(rows)
        way(tty, rows)
        last = pipe.getvalue().rstrip("\n").split("\n")[-1].split("\r")[-1]
        print(f"  {name:<13} pipe: {describe(pipe.getvalue())}  terminal: {describe(tty.getvalue())}  "
              f"{per_update * 1e6:>6,.0f} µs/update")
        print(f"  {'':<13} last line in the pipe: {last[:110]!r}")
    print(f"== import on top of trio (best of {args.imports}) ==")
    print("  " + line(["tqdm", "rich.progress"], args.imports))


if __name__ == "__main__":
    main()
