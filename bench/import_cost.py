"""What importing a module costs a process that has trio already (the compare_*.py scripts).

Each figure is the best of ``tries`` fresh interpreters, less the same interpreter
importing nothing, so it is the module's own import and what it pulls in beyond trio.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _seconds(stmt: str, tries: int) -> float:
    code = f"import time, trio; t = time.perf_counter(); {stmt}; print(time.perf_counter() - t)"
    return min(float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                                    cwd=ROOT).stdout) for _ in range(tries))


def import_ms(modules: list[str], tries: int) -> dict[str, float]:
    """Milliseconds to import each of ``modules`` on top of trio."""
    base = _seconds("pass", tries)
    return {m: max(_seconds(f"import {m}", tries) - base, 0.0) * 1e3 for m in modules}


def line(modules: list[str], tries: int) -> str:
    return "   ".join(f"{m} {ms:.1f} ms" for m, ms in import_ms(modules, tries).items())
