"""A Scrapy spider as a dedupnet local host: one ``scrapy crawl follow`` process of the
example project (examples/scrapy) on the keys of a ``dedupnet local --no-crawl`` host,
bound to the host's IP (``DOWNLOAD_BIND_ADDRESS``) so that the web's request log says
which host fetched what. Shared by the Scrapy tests and the benchmarks that crawl the
synthetic web through the Scrapy path."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["EXAMPLE", "READY", "Spider"]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "scrapy"
#: What the scheduler logs once it has taken up its host's keys.
READY = "is the crawler of"


class Spider:
    """One ``scrapy crawl follow`` process of the example project on a host's keys."""

    def __init__(self, ip: str, redis_url: str, prefix: str, logdir: Path, extra: tuple[str, ...] = ()):
        self.ip = ip
        self.log_path = logdir / f"scrapy-{ip}.log"
        self.argv = [sys.executable, "-m", "scrapy", "crawl", "follow",
                     "-s", f"DEDUPNET_REDIS_URL={redis_url}", "-s", f"DEDUPNET_PREFIX={prefix}",
                     "-s", f"DEDUPNET_CONSUMER={ip}", "-s", f"DOWNLOAD_BIND_ADDRESS={ip}",
                     "-s", "LOG_LEVEL=INFO", "-s", "DEDUPNET_FLUSH_INTERVAL=0.1", *extra]
        self.proc: subprocess.Popen | None = None

    def start(self, env: dict) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, cwd=EXAMPLE, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def ready(self) -> bool:
        return READY in self.log()

    def stop(self, sig=signal.SIGTERM, timeout: float = 20.0) -> None:
        if not self.alive():
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
