"""``dedupnet reassign --host IP``: the work of a host that is gone goes to the live
hosts of its LAN, through its center.

Two places hold a host's unfinished tasks: its center's ``task_URL`` (sent to it, not
acknowledged) and its own ``task_pool`` (in its Redis). The center moves the first as
a graceful leave would; the second only this tool can reach, when the host's data
directory (or Redis) is at hand, and never while the host runs. Nothing may be fetched
twice: the entries are first set aside in the host's Redis (``task_pool`` renamed to
``task_pool:reassigning``, one atomic step), so the host, started again, does not crawl
them; then sent to the center in Task messages naming the host, and each batch leaves
the host's Redis once the center has acknowledged storing it. Stopped half way, the
tool is run again and sends what is still set aside (a batch acknowledged but not yet
removed goes again: its receiving host finds it in its own ``task_pool`` and drops it).
"""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path

import redis
import trio

from dedupnet.adapters.monitor.census import StatusRefused, control_register, fetch_status
from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.adapters.runtime import open_store
from dedupnet.adapters.storage.store import TASK_POOL
from dedupnet.adapters.net.transport import connect
from dedupnet.codec import wire
from dedupnet.codec.auth import keyring_from
from dedupnet.codec.messages import Ack, Error, Task
from dedupnet.codec.numbers import host_id_from_ip, make_number
from local_host.frontier import sites

log = logging.getLogger("dedupnet.service.reassign")

SET_ASIDE = f"{TASK_POOL}:reassigning"
#: URLs per Task (a Task holds at most 10,000).
BATCH = 5000


class Refused(Exception):
    """The center, or the state of the host, does not allow the reassignment."""


def _task_pool_of(store) -> list[tuple[bytes, str]]:
    entries = store.redis.xrange(store.key(SET_ASIDE))
    return [(eid, fields[b"u"].decode()) for eid, fields in entries if b"u" in fields]


def set_aside(store) -> list[tuple[bytes, str]]:
    """The host's tasks out of its ``task_pool``, in one atomic step, with whatever an
    earlier run left set aside."""
    if not store.redis.exists(store.key(SET_ASIDE)):
        sites.unsort(store)  # the queued tasks into the stream, to be set aside with it
        if store.redis.exists(store.key(TASK_POOL)):
            store.redis.rename(store.key(TASK_POOL), store.key(SET_ASIDE))
    return _task_pool_of(store)


class HostData:
    """The dead host's Redis: ``redis_url``, or the embedded one of ``data_dir`` started
    on its append-only file (refused while the host's own daemon runs it)."""

    def __init__(self, data_dir: str | None, redis_url: str | None, prefix: str):
        self.data_dir, self.redis_url, self.prefix = data_dir, redis_url, prefix

    def __enter__(self):
        if self.redis_url is None:
            url_file = Path(self.data_dir) / "redis.url"
            if url_file.is_file():
                try:
                    redis.Redis.from_url(url_file.read_text().strip(), socket_timeout=2).ping()
                except redis.RedisError:
                    pass  # left by a daemon that was killed: nobody uses the data
                else:
                    raise Refused(f"the host's Redis in {self.data_dir} is running ({url_file} answers): its "
                                  "daemon is not stopped; stop it first")
            if not (Path(self.data_dir) / "appendonlydir").exists() and not any(Path(self.data_dir).glob("*.aof")):
                raise Refused(f"{self.data_dir} holds no Redis data (no appendonlydir): give the host's --data-dir")
        self._ctx = open_store(self.redis_url, self.prefix, data_dir=self.data_dir)
        store, _ = self._ctx.__enter__()
        return store

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


async def _send(conn, task: Task) -> Ack:
    conn.send_nowait(wire.encode(task))
    while True:
        reply = await conn.receive()
        if isinstance(reply, Ack) and reply.number == task.number:
            return reply
        if isinstance(reply, Error):
            raise Refused(f"the center refused: {reply.reason}: {reply.message}")


REFUSALS = {
    "host-live": "it is connected to its center: a live host keeps its tasks (stop it first, or let it leave)",
    "unknown-host": "its center has no such host and holds nothing for it (check the IP)",
    "host-not-in-lan": "it is not in this center's LAN (ask the center of its network)",
}


async def reassign(center: tuple[str, int], host: str, *, key_file: str | None, data: HostData | None,
                   leave_task_pool: bool = False, timeout: float = 10.0) -> dict:
    keyring = keyring_from(key_file)
    status = await fetch_status(center, timeout, keyring=keyring)
    if status.get("role") != "center":
        raise Refused(f"{center[0]}:{center[1]} is a {status.get('role')}: give the address of the host's center")
    entry = next((e for e in status.get("liveness", []) if e["kind"] == "host" and e["member"] == host), None)
    if entry is not None and entry["state"] != "down":
        raise Refused(f"host {host} is {entry['state']}: " + REFUSALS["host-live"])
    moved = {"host": host, "network": status["network"], "task_URL": entry["task_urls"] if entry else 0,
             "task_pool": 0, "task_pool_reached": data is not None}
    heard = entry.get("task_pool") if entry else None
    if data is None and not leave_task_pool and heard != 0:
        held = "an unknown number of tasks" if heard is None else f"{heard} tasks when last heard"
        raise Refused(f"host {host}'s own task_pool ({held}) is in its Redis: give --data-dir (or --redis) of "
                      "the host to move it too, or --leave-task-pool to move what its center holds: every URL it "
                      "gave the host and was not told is finished (its ledger); if the host starts again it is "
                      "told what moved and drops it")
    ip, register = control_register(center)
    host_id = host_id_from_ip(host, status["lan"])
    async with await connect(*center, register, local_ip=ip, counters=Counters(), keyring=keyring) as conn:
        if data is None:
            ack = await _send(conn, Task(0, (), host))
            if ack.status != "stored":
                raise Refused(f"host {host}: " + REFUSALS.get(ack.reason, f"refused ({ack.reason})"))
            return moved
        with data as store:
            entries = await trio.to_thread.run_sync(set_aside, store)
            first = True
            while entries or first:
                batch, entries = entries[:BATCH], entries[BATCH:]
                (sequence,) = await trio.to_thread.run_sync(store.next_sequences, 1)
                ack = await _send(conn, Task(make_number(status["network"], host_id, sequence),
                                             tuple(dict.fromkeys(u for _, u in batch)), host))
                if ack.status != "stored":
                    if first:  # nothing moved: the tasks go back where they were
                        await trio.to_thread.run_sync(_put_back, store)
                    raise Refused(f"host {host}: " + REFUSALS.get(ack.reason, f"refused ({ack.reason})"))
                if batch:
                    await trio.to_thread.run_sync(store.redis.xdel, store.key(SET_ASIDE), *[i for i, _ in batch])
                moved["task_pool"] += len(batch)
                first = False
            store.redis.delete(store.key(SET_ASIDE))
    return moved


def _put_back(store) -> None:
    if not store.redis.exists(store.key(TASK_POOL)):
        store.redis.rename(store.key(SET_ASIDE), store.key(TASK_POOL))


def run_reassign(center: tuple[str, int], host: str, *, key_file: str | None, data_dir: str | None,
                 redis_url: str | None, prefix: str | None, leave_task_pool: bool = False) -> int:
    """The command: one line saying what moved, or why nothing did."""
    data = None
    if data_dir is not None or redis_url is not None:
        data = HostData(data_dir, redis_url, prefix or f"dedupnet:host:{host}")
    try:
        moved = trio.run(functools.partial(reassign, center, host, key_file=key_file, data=data,
                                           leave_task_pool=leave_task_pool))
    except Refused as e:
        print(f"dedupnet reassign: {e}", flush=True, file=sys.stderr)
        return 2
    except (OSError, trio.TooSlowError, StatusRefused) as e:
        why = "no answer in time" if isinstance(e, trio.TooSlowError) else str(e)
        print(f"dedupnet reassign: the center at {center[0]}:{center[1]} did not take the request: {why}",
              file=sys.stderr)
        return 1
    pool = (f"{moved['task_pool']} from its task_pool" if moved["task_pool_reached"] else
            "none of its own task_pool (left in its Redis)")
    print(f"host {host}: {moved['task_URL']} tasks of its center's task_URL and {pool} handed to the live hosts "
          f"of network {moved['network']}; the center no longer counts it as one of its hosts")
    return 0
