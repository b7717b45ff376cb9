"""Run `dedupnet sim --processes ARGS` and sample every center's and host's RSS every 5 s; print each
one's growth over the second half of the run (the soak target: under 2 MB).

    .venv/bin/python bench/bench_soak_rss.py --networks 3 --hosts 3 --pages 180000 --light --timeout 1500
"""
import subprocess
import sys
import time
import psutil
import json
args = sys.argv[1:]
p = subprocess.Popen([".venv/bin/python", "-m", "dedupnet.cli", "sim", "--processes", *args],
                     stdout=open("/tmp/soak_out.txt", "w"), stderr=subprocess.STDOUT)
me = psutil.Process(p.pid)
samples = []
t0 = time.monotonic()
while p.poll() is None:
    time.sleep(5)
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
    if row:
        samples.append((round(time.monotonic() - t0), row))
json.dump(samples, open("/tmp/soak_rss.json", "w"))
if samples:
    half = samples[len(samples) // 2]
    last = samples[-2] if len(samples) > 2 else samples[-1]
    print(f"{len(samples)} samples over {last[0]} s; growth over the second half ({half[0]} -> {last[0]} s), MB:")
    for k in sorted(last[1]):
        if k in half[1]:
            print(f"  {k:<22} {half[1][k]:6.1f} -> {last[1][k]:6.1f}  ({last[1][k] - half[1][k]:+.1f})")
