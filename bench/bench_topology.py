"""Topology sweep: 2x2, 3x3, 5x5, 8x4 networks x hosts on the same web and seed, in one
table, optionally side by side with another checkout (``--baseline-python``).

    .venv/bin/python bench/bench_topology.py --pages 10000
    .venv/bin/python bench/bench_topology.py --layouts 2x2,3x3 --pages 3000 \\
        --baseline-python /work/base/.venv/bin/python --out sweep.json

See dedupnet/harness/sweep.py (``dedupnet sim --sweep LAYOUTS`` runs the same).
"""

from pathlib import Path
import sys

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code, whatever is installed

from dedupnet.harness.sweep import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
