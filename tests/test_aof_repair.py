"""A damaged AOF tail does not stop a daemon's Redis: real embedded servers stopped, their
real AOF files cut or followed by garbage, started again through EmbeddedRedis (and the
daemons' open_store): the data before the damage is there, and an ERROR line names the
file and the bytes cut."""

import logging
import os

import pytest
import redis

from dedupnet.adapters.storage.aof import valid_prefix
from dedupnet.adapters.storage.embedded import EmbeddedRedis
from dedupnet.adapters.runtime import open_store

KEYS = 20


def _filled(data_dir):
    """A persistent server's data dir with KEYS keys written and the server stopped; the
    incremental AOF file that holds them."""
    server = EmbeddedRedis(persistent=True, data_dir=data_dir)
    client = redis.Redis.from_url(server.start())
    try:
        for i in range(KEYS):
            client.set(f"k{i}", "v" * 40)
    finally:
        client.close()
        server.stop()
    (incr,) = (data_dir / "appendonlydir").glob("*.incr.aof")
    return incr


def _keys(url):
    client = redis.Redis.from_url(url)
    try:
        return {k.decode() for k in client.keys("*")}
    finally:
        client.close()


def _errors(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and "AOF file" in r.getMessage()]


@pytest.mark.parametrize("garbage", [b"\0" * 4096, b"*3\r\n$3\r\nSET\r\n$2\r\nzz\r\n$1\r\nx\r\n\xff\xfe junk"])
def test_garbage_after_the_last_command_is_cut_and_the_server_starts(tmp_path, caplog, garbage):
    incr = _filled(tmp_path)
    whole = incr.stat().st_size
    with open(incr, "ab") as f:
        f.write(garbage)
    caplog.set_level(logging.INFO)
    server = EmbeddedRedis(persistent=True, data_dir=tmp_path)
    with server as url:
        assert _keys(url) >= {f"k{i}" for i in range(KEYS)}
    (line,) = _errors(caplog)
    assert str(incr) in line
    cut = len(garbage) - (0 if garbage[:1] == b"\0" else garbage.index(b"\xff"))  # the whole SET is kept
    assert f"cut the last {cut} " in line
    assert f"of its {whole + len(garbage)} bytes" in line
    (cut_record,) = server.aof_cuts
    assert cut_record.kept >= whole and cut_record.copy.stat().st_size == whole + len(garbage)  # the original kept
    assert incr.stat().st_size >= whole


def test_a_transaction_without_its_exec_before_the_garbage_is_cut_whole(tmp_path, caplog):
    """An event's writes are one MULTI/EXEC: all or nothing after a repair too."""
    incr = _filled(tmp_path)
    whole = incr.stat().st_size
    with open(incr, "ab") as f:
        f.write(b"*1\r\n$5\r\nMULTI\r\n*3\r\n$3\r\nSET\r\n$4\r\nhalf\r\n$1\r\n1\r\n" + b"\0" * 100)
    caplog.set_level(logging.INFO)
    with EmbeddedRedis(persistent=True, data_dir=tmp_path) as url:
        keys = _keys(url)
    assert "half" not in keys and f"k{KEYS - 1}" in keys
    assert incr.stat().st_size == whole
    (line,) = _errors(caplog)
    assert f"bytes {whole}.." in line


def test_a_tail_cut_inside_a_command_loads_and_the_cut_is_reported(tmp_path, caplog):
    incr = _filled(tmp_path)
    whole = incr.stat().st_size
    os.truncate(incr, whole - 7)  # inside the last SET
    caplog.set_level(logging.INFO)
    with EmbeddedRedis(persistent=True, data_dir=tmp_path) as url:
        keys = _keys(url)
    assert {f"k{i}" for i in range(KEYS - 1)} <= keys and f"k{KEYS - 1}" not in keys
    (line,) = _errors(caplog)
    kept = incr.stat().st_size
    assert str(incr) in line and f"cut its last {whole - 7 - kept} of {whole - 7} bytes" in line


def test_a_daemons_store_opens_on_a_damaged_aof(tmp_path, caplog):
    """The daemons' own path (runtime.open_store with a data dir)."""
    incr = _filled(tmp_path)
    with open(incr, "ab") as f:
        f.write(b"\0" * 512)
    caplog.set_level(logging.INFO)
    with open_store(None, "p", data_dir=str(tmp_path)) as (store, server):
        assert store.redis.get("k0") == b"v" * 40
    assert len(_errors(caplog)) == 1


def test_valid_prefix():
    cmd = b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n"
    multi, exec_ = b"*1\r\n$5\r\nMULTI\r\n", b"*1\r\n$4\r\nEXEC\r\n"
    assert valid_prefix(cmd * 3) == (3 * len(cmd), "")
    assert valid_prefix(b"#TS:1\r\n" + cmd)[0] == 7 + len(cmd)
    assert valid_prefix(cmd + cmd[:-3])[0] == len(cmd)
    assert valid_prefix(cmd + multi + cmd + exec_ + cmd)[0] == 3 * len(cmd) + len(multi) + len(exec_)
    kept, why = valid_prefix(cmd + multi + cmd)
    assert kept == len(cmd) and "EXEC" in why
    kept, why = valid_prefix(cmd + b"\0\0\0")
    assert kept == len(cmd) and f"byte {len(cmd)}" in why
    assert valid_prefix(b"*2\r\n$3\r\nGET\r\n$9999999999\r\n")[0] == 0
