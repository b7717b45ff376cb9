"""A daemon supervises the Redis it started (dedupnet/adapters/runtime.py supervise_redis):
a server that dies is started again on its port and data dir, and the daemon carries on;
one that cannot be started again ends the daemon with one line saying why (exit 1).
Real servers, real ``kill -9``; the waits are for processes, so the clock is real."""

import os
import signal
import socket
import subprocess
import time

import pytest
import redis
import trio

from dedupnet.adapters.storage.embedded import EmbeddedRedis
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.runtime import RedisDied, supervise_redis

from .helpers import DEDUPNET
from .procs import server_processes



@pytest.fixture
def server(tmp_path):
    s = EmbeddedRedis(persistent=True, data_dir=tmp_path / "redis")
    s.start()
    yield s
    s.stop()


def _kill(server: EmbeddedRedis) -> int:
    pid = server.pid
    os.kill(pid, signal.SIGKILL)
    return pid


async def test_a_killed_server_is_started_again_on_its_port_with_its_data(server):
    url = server.url
    client = redis.Redis.from_url(url)
    client.set("kept", "yes")
    counters = Counters()
    old = server.pid
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: supervise_redis(server, counters, poll=0.05))
        _kill(server)
        with trio.fail_after(30):
            while server.pid == old or not server.running:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert server.url == url and counters.get("redis_restarts") == 1
    assert client.get("kept") == b"yes"  # same port, same AOF
    client.close()
    assert not any(pid == old for pid, _ in server_processes(lambda *a: True))  # reaped, no zombie


async def test_a_server_that_cannot_be_started_again_ends_the_supervisor_with_one_line(server):
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    pid = _kill(server)
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    deadline = time.monotonic() + 10
    while True:  # the port is free once the kernel has closed the dead server's socket
        try:
            taken.bind(("127.0.0.1", port))
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    taken.listen()
    try:
        with pytest.raises(RedisDied) as caught, trio.fail_after(60):
            await supervise_redis(server, Counters(), poll=0.05)
    finally:
        taken.close()
    text = str(caught.value)
    assert "\n" not in text and f"pid {pid}" in text and "killed by SIGKILL" in text
    assert "could not be restarted" in text and "in use" in text


def stat_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_a_host_daemon_whose_redis_cannot_come_back_exits_1_with_one_line(tmp_path):
    """The daemon as a service manager sees it: not alive and stuck, but gone with a reason."""
    ip = "127.0.42.10"
    with socket.socket() as s:
        s.bind((ip, 0))
        status_port = s.getsockname()[1]
    log_path = tmp_path / "host.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([*DEDUPNET, "local", "--network", "42", "--ip", ip, "--center", "127.0.42.1:9",
                                 "--listen", f"{ip}:{status_port}", "--no-crawl", "--data-dir", str(tmp_path / "d")],
                                cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        url_file = tmp_path / "d" / "redis.url"
        deadline = time.monotonic() + 30
        while not url_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        port = int(url_file.read_text().strip().rsplit(":", 1)[1].split("/")[0])
        (pid, _), = server_processes(lambda ppid, cwd, cmd: ppid == proc.pid)
        taken = socket.socket()
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # The daemon is stopped while its Redis dies and the port is taken, or it could
        # restart the server first.
        os.kill(proc.pid, signal.SIGSTOP)
        while stat_state(proc.pid) != "T":
            assert time.monotonic() < deadline + 10
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        while True:
            try:
                taken.bind(("127.0.0.1", port))
                break
            except OSError:
                assert time.monotonic() < deadline + 10
                time.sleep(0.01)
        taken.listen()
        os.kill(proc.pid, signal.SIGCONT)
        try:
            code = proc.wait(timeout=60)
        finally:
            taken.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log_path.read_text()
    assert code == 1, text
    (line,) = [entry for entry in text.splitlines() if "exiting:" in entry]
    assert "CRITICAL" in line and f"pid {pid}" in line and "could not be restarted" in line
