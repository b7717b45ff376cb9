"""Where a key lives on a Redis Cluster: the cluster URL, the slot of a key, the slot map
(``CLUSTER SLOTS``) and a batch that keeps every command with its slot, so that it can
be split by node. The key layout is in the package docstring."""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import redis
from redis.crc import key_slot

from dedupnet.adapters.storage.store import Batch, FingerprintReplies, is_cluster_url
from dedupnet.adapters.storage.resp import MEMBER_RECORD, bucket_heads, encode_arg, pack_command

log = logging.getLogger("dedupnet.adapters.storage.redis_cluster")

SLOTS = 16384
Addr = tuple[str, int]

_NO_KEY = {b"MULTI", b"EXEC", b"PING", b"INFO", b"DBSIZE", b"ECHO", b"TIME"}
MULTI = pack_command(b"MULTI")
EXEC = pack_command(b"EXEC")


def cluster_seeds(url: str) -> tuple[list[Addr], dict[str, Any]]:
    """``redis+cluster://[user:pass@]host:port[,host:port...]`` -> the nodes to ask
    for the slot map, and connection options (password)."""
    if not is_cluster_url(url):
        raise ValueError(f"not a cluster URL (redis+cluster://host:port): {url}")
    rest = url.split("://", 1)[1]
    auth, _, hosts = rest.rpartition("@")
    hosts = hosts.split("/", 1)[0].split("?", 1)[0]
    seeds: list[Addr] = []
    for part in hosts.split(","):
        parsed = urlsplit(f"//{part}")
        seeds.append((parsed.hostname or "127.0.0.1", parsed.port or 6379))
    options: dict[str, Any] = {}
    if auth:
        user, _, password = auth.rpartition(":")
        options = {"username": user or None, "password": password}
    if parse_qs(urlsplit(url.replace("+cluster", "", 1)).query).get("db", ["0"])[0] not in ("0", ""):
        raise ValueError("Redis Cluster has only database 0")
    return seeds, options


def admin_client(url: str) -> Any:
    """A redis-py client for admin calls (INFO, SCAN, MEMORY USAGE): ``RedisCluster`` for
    a cluster URL (it routes SCAN and INFO to every primary), else ``Redis``."""
    if not is_cluster_url(url):
        return redis.Redis.from_url(url)
    seeds, options = cluster_seeds(url)
    return redis.RedisCluster(startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in seeds],
                              socket_connect_timeout=5.0, protocol=2, **options)


def merged_info(client: Any, section: str) -> dict:
    """``INFO section`` of one server, or of every cluster node summed (numbers in
    nested dicts, e.g. ``cmdstat_sadd: {calls: ...}``, are added up)."""
    info = client.info(section)
    if not isinstance(client, redis.RedisCluster):
        return info
    nodes = info.values() if info and all(isinstance(v, dict) and ":" in k for k, v in info.items()) else [info]
    out: dict = {}
    for node in nodes:
        for key, value in node.items():
            if isinstance(value, dict):
                slot = out.setdefault(key, {})
                for k, v in value.items():
                    if isinstance(v, (int, float)):
                        slot[k] = slot.get(k, 0) + v
            elif isinstance(value, (int, float)):
                out[key] = out.get(key, 0) + value
    return out


@functools.lru_cache(maxsize=4096)
def slot_of(key: bytes) -> int:
    return key_slot(key)


@functools.lru_cache(maxsize=1024)
def bucket_slots(key: str, bucket_bits: int) -> np.ndarray:
    """Slot of every bucket key ``<key>:<b>`` of a fingerprint set."""
    base = key.encode() + b":"
    return np.array([key_slot(base + b"%d" % b) for b in range(1 << bucket_bits)], dtype=np.int32)


def untagged(key: str) -> str:
    """``{prefix}:admitted`` -> ``prefix:admitted``: a fingerprint set's bucket keys lose
    the daemon's hash tag, so they spread over slots."""
    if key.startswith("{"):
        end = key.find("}")
        if end > 0:
            return key[1:end] + key[end + 1:]
    return key


def key_of(args: tuple) -> bytes | None:
    name = encode_arg(args[0]).upper()
    if name in _NO_KEY or len(args) < 2:
        return None
    if name in (b"XREADGROUP", b"XREAD"):
        upper = [encode_arg(a).upper() if isinstance(a, (bytes, str)) else b"" for a in args]
        return encode_arg(args[upper.index(b"STREAMS") + 1])
    if name in (b"XGROUP", b"OBJECT", b"MEMORY"):
        return encode_arg(args[2])
    if name in (b"EVAL", b"EVALSHA"):
        return encode_arg(args[3]) if int(args[2]) > 0 else None
    return encode_arg(args[1])


class ClusterBatch(Batch):
    """A :class:`~dedupnet.adapters.storage.store.Batch` that keeps each command apart with its slot, so
    the batch can be split by node. ``slot -1``: no key (the home node takes it)."""

    def __init__(self, bucket_bits: int, home_slot: int):
        super().__init__(bucket_bits)
        self.home_slot = home_slot
        self.cmds: list[bytes] = []
        self.slots: list[int] = []
        self.spread: list[bool] = []  # fingerprint commands: never in the home slot's MULTI

    def add(self, *args: Any) -> int:
        key = key_of(args)
        self.cmds.append(pack_command(*args))
        self.slots.append(slot_of(key) if key is not None else -1)
        self.spread.append(False)
        self._replies += 1
        return self._replies - 1

    def add_packed(self, parts: list, key: bytes) -> int:
        self.cmds.append(b"".join(parts))
        self.slots.append(slot_of(key))
        self.spread.append(True)
        self._replies += 1
        return self._replies - 1

    def _bucket_commands(self, command: bytes, key: str, fps: np.ndarray) -> FingerprintReplies:
        """One command per bucket, each with its own slot: the buckets' keys lose the hash
        tag, so they spread over the masters."""
        first = self._replies
        key = untagged(key)
        buckets, order, starts, ends, view = self._records(fps)
        heads = bucket_heads(command, key)
        slots = bucket_slots(key, self.bucket_bits)
        for bucket, start, end in zip(buckets[starts].tolist(), starts.tolist(), ends.tolist()):
            self.cmds.append(b"".join((b"*%d\r\n" % (end - start + 2), heads[bucket],
                                       view[start * MEMBER_RECORD: end * MEMBER_RECORD])))
            self.slots.append(int(slots[bucket]))
            self.spread.append(True)
        self._replies += len(starts)
        return FingerprintReplies(first, order, ends - starts, len(fps))

    def payload(self) -> bytes:
        return b"".join(self.cmds)

    @property
    def transaction(self) -> bool:
        return bool(self.cmds) and self.cmds[0] == MULTI


class SlotMap:
    """Slot -> the master that holds it, from ``CLUSTER SLOTS`` (our own: a list of
    16,384 addresses, refreshed when a node answers ``-MOVED`` or cannot be reached)."""

    def __init__(self, seeds: list[Addr], options: dict[str, Any]):
        self.seeds = list(seeds)
        self.options = options
        self.owner: list[Addr | None] = [None] * SLOTS
        self.known: list[Addr] = list(seeds)
        self.refreshes = 0
        self._lock = threading.Lock()

    def node(self, slot: int) -> Addr:
        addr = self.owner[slot] if slot >= 0 else None
        return addr or self.known[0]

    @property
    def loaded(self) -> bool:
        return self.owner[0] is not None

    def refresh(self) -> None:
        """Ask the known nodes, one after the other, for the slot map; keep the old one
        if none answers (the caller's back-off decides how long to go on)."""
        with self._lock:
            errors = []
            for addr in dict.fromkeys(self.known + self.seeds):
                try:
                    client = redis.Redis(host=addr[0], port=addr[1], socket_connect_timeout=2.0,
                                         socket_timeout=5.0, protocol=2, retry=None, **self.options)
                    try:
                        reply = client.execute_command("CLUSTER SLOTS")
                    finally:
                        client.close()
                except (redis.RedisError, OSError) as e:
                    errors.append(f"{addr[0]}:{addr[1]}: {e}")
                    continue
                owner: list[Addr | None] = [None] * SLOTS
                nodes: list[Addr] = []
                for entry in reply:
                    start, end, master = int(entry[0]), int(entry[1]), entry[2]
                    host = master[0].decode() if isinstance(master[0], bytes) else str(master[0])
                    a = (host or addr[0], int(master[1]))
                    owner[start:end + 1] = [a] * (end - start + 1)
                    nodes.append(a)
                self.owner = owner
                self.known = list(dict.fromkeys(nodes + self.known))
                self.refreshes += 1
                return
            log.warning("Redis Cluster: no node gave the slot map (%s)", "; ".join(errors))
