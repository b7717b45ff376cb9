"""Writes that must take effect once however often their batch is sent.

A batch whose reply is lost with its connection is sent again (``Store.execute``, then
``until_stored``), and a batch that had run on the server runs a second time. Most of a
core's writes do not mind (``SADD``, ``HSET``, ``XACK``); a few would: ``RPUSH`` of a
host's tasks queues each URL twice (two fetches of one page by one host), ``LTRIM`` of
``tasks_done`` by a count drops reports never sent. Those go through :func:`once`: a
script that runs them only if the write's token is new, in the same transaction.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from dedupnet.adapters.storage.store import Batch, Store

#: Sorted set: token of a write done once -> epoch ms it was done; the newest KEEP kept.
APPLIED = "applied"
#: Tokens remembered. A resent batch is the writer's very next write (its writes go one
#: at a time), so any number above a handful is enough.
KEEP = 4096

_ONCE = b"""
if redis.call('ZADD', KEYS[1], 'NX', ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -tonumber(ARGV[3]) - 1)
local i = 4
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  redis.call(unpack(ARGV, i + 1, i + n))
  i = i + n + 1
end
return 1
"""


def once(batch: Batch, store: Store, token: str, commands: Iterable[Sequence]) -> int:
    """Queue into ``batch`` ``commands`` (each a sequence: command, args) to run only if
    no write with ``token`` ran before; returns the index of its reply (1: ran, 0: done
    before). Keys named in ``commands`` must live where :meth:`Store.key` puts them (one
    slot on a cluster)."""
    args: list = []
    for command in commands:
        args += [len(command), *command]
    return batch.add(b"EVAL", _ONCE, 1, store.key(APPLIED), int(time.time() * 1000), token, KEEP, *args)
