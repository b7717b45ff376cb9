"""Run `dedupnet sim --processes ARGS` and sample every center's and host's RSS every 5 s; print each
one's growth over the second half of the crawl, while every daemon is up (the soak target: under 2 MB).
SOAK_OUT (default /tmp/soak) prefixes the files it writes, so two checkouts' soaks kept side by side do
not overwrite each other: PREFIX_out.txt (the run's report) and PREFIX_rss.json (the samples).

    .venv/bin/python bench/bench_soak_rss.py --networks 3 --hosts 3 --pages 180000 --light --timeout 2400
"""
import json
import os
import subprocess
import sys
import time

import psutil

#: One sample: seconds since the start, and each daemon's RSS in MB ("center:N", "local:IP")
#: with the pages fetched so far ("pages").
Sample = tuple[int, dict]


def pages_so_far(report: str) -> int:
    """Pages fetched so far, from the run's last progress line ("t= ...s  pages N ...")."""
    with open(report, "rb") as f:
        f.seek(max(0, f.seek(0, 2) - 4096))
        lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.lstrip().startswith("t=")]
    return int(lines[-1].split("pages")[1].split()[0]) if lines else 0


def sample(me: psutil.Process) -> dict:
    row = {}
    try:
        for c in me.children(recursive=True):
            try:
                cmd = c.cmdline()
            except psutil.Error:
                continue
            if "center" in cmd or "local" in cmd:
                role = "center" if "center" in cmd else "local"
                ident = cmd[cmd.index("--network") + 1] if role == "center" and "--network" in cmd else (
                    cmd[cmd.index("--ip") + 1] if "--ip" in cmd else str(c.pid))
                row[f"{role}:{ident}"] = c.memory_info().rss / 1e6
    except psutil.Error:
        pass
    return row


def crawl_window(samples: list[Sample]) -> list[Sample]:
    """The samples of the crawl: every daemon up, up to the last page fetched. A run ends
    with its report being made and then the hosts handing their tasks back and exiting one
    by one, and the centers' RSS jumps then (+1 to +3 MB in a 3 x 3 soak): the stopping,
    not the crawl."""
    everyone = max((set(row) for _, row in samples), key=len)
    up = [i for i, (_, row) in enumerate(samples) if set(row) >= everyone]
    if not up:
        return samples
    window = samples[up[0]:up[-1] + 1]
    final = window[-1][1].get("pages", 0)
    return window[:next(i for i, (_, row) in enumerate(window) if row.get("pages", 0) == final) + 1]


def second_half(samples: list[Sample]) -> tuple[Sample, Sample]:
    """The samples at the middle and at the end of the crawl's window."""
    window = crawl_window(samples)
    last = window[-1]
    return min(window, key=lambda s: abs(s[0] - (window[0][0] + last[0]) / 2)), last


def admitted(report: str) -> int | None:
    """URLs admitted over the run, from the report's "URLs admitted per network" line."""
    for line in report.splitlines():
        if line.strip().startswith("URLs admitted per network"):
            return sum(int(part.rsplit(":", 1)[1]) for part in line.split()[4:])
    return None


def main(args: list[str]) -> None:
    out = os.environ.get("SOAK_OUT", "/tmp/soak")
    p = subprocess.Popen([".venv/bin/python", "-m", "dedupnet.cli", "sim", "--processes", *args],
                         stdout=open(f"{out}_out.txt", "w"), stderr=subprocess.STDOUT)
    me = psutil.Process(p.pid)
    samples: list[Sample] = []
    t0 = time.monotonic()
    while p.poll() is None:
        time.sleep(5)
        row = sample(me)
        if row:
            row["pages"] = pages_so_far(f"{out}_out.txt")
            samples.append((round(time.monotonic() - t0), row))
    json.dump(samples, open(f"{out}_rss.json", "w"))
    if not samples:
        return
    half, last = second_half(samples)
    urls = admitted(open(f"{out}_out.txt").read())
    print(f"{len(samples)} samples; URLs admitted {urls if urls is None else f'{urls:,}'}; growth over the "
          f"second half of the crawl ({half[0]} -> {last[0]} s, pages {half[1]['pages']:,} -> {last[1]['pages']:,}), MB:")
    for k in sorted(last[1]):
        if k in half[1] and k != "pages":
            print(f"  {k:<22} {half[1][k]:6.1f} -> {last[1][k]:6.1f}  ({last[1][k] - half[1][k]:+.1f})")


if __name__ == "__main__":
    main(sys.argv[1:])
