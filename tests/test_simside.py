"""``dedupnet sim --baseline``: the same run with two checkouts' code, side by side
(dedupnet/harness/simside.py)."""

import subprocess
import sys
from pathlib import Path

from dedupnet.harness.simside import figures, format_side_by_side, sim_argv_of

REPO = Path(__file__).resolve().parents[1]


def test_the_comparisons_own_options_are_not_passed_on():
    argv = ["dedupnet", "--log-level", "INFO", "sim", "--networks", "2", "--baseline", "/x", "--rounds=3",
            "--json", "out.json", "--baseline-python=/y/python", "--pages", "500", "--plot", "p.png"]
    assert sim_argv_of(argv) == ["--networks", "2", "--pages", "500"]


def test_a_figure_the_baseline_lacks_is_na_and_the_rest_have_ratios():
    this = figures({"requests": 100, "pages_per_s": 50.0, "cpu_total_ms_per_page": 2.0,
                    "cpu_ms_per_page": {"hosts": 1.5, "web": 0.5}, "duplicate_fetches": 0, "lost_urls": 0}, 0.5)
    base = figures({"requests": 100, "pages_per_s": 25.0, "duplicate_fetches": 0, "lost_urls": 0}, 1.0)
    assert this["whole run CPU ms/page"] == 5.0 and base["whole run CPU ms/page"] == 10.0
    rows = {line[:24].strip(): line[24:].split() for line in format_side_by_side([base], [this]).splitlines()[1:]}
    assert rows["pages/s"] == ["25.00", "50.00", "2.00"]
    assert rows["CPU ms/page"] == ["n/a", "2.00", "n/a"]
    assert rows["whole run CPU ms/page"] == ["10.00", "5.00", "0.50"]
    assert rows["centers"] == ["n/a", "n/a", "n/a"]


def test_a_run_against_this_very_checkout_prints_both_sides(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "dedupnet.cli", "sim", "--networks", "1", "--hosts", "2", "--pages", "150",
         "--sites", "3", "--light", "--baseline", str(REPO), "--json", str(tmp_path / "ignored.json")],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = proc.stdout.split("Side by side:", 1)[1]
    cpu = next(line for line in table.splitlines() if line.startswith("CPU ms/page")).split()[2:]
    assert len(cpu) == 3 and float(cpu[0]) > 0 and float(cpu[1]) > 0 and float(cpu[2]) > 0
    assert not (tmp_path / "ignored.json").exists()  # each side writes its own report
