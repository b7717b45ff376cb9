"""The store on a Redis Cluster (``redis+cluster://host:port``).

A centre's ``admitted`` record for a web-scale crawl (billions of URLs at ~8 bytes each)
outgrows one server; Redis Cluster (or a Valkey cluster) spreads keys over 16,384 hash
slots held by several masters. :class:`ClusterStore` is a :class:`~dedupnet.adapters.storage.store.Store`
with the same API and the same hand-packed RESP; what changes is the key layout and
how a batch travels.

**Keys.** A daemon's own keys carry its prefix as a hash tag, so they share one slot
and one MULTI/EXEC can hold them (``{<prefix>}:URL_pool``, ``{<prefix>}:task_URL``,
``{<prefix>}:local_reduce_pool``, ...). Fingerprint buckets do not: their name is the
untagged ``<prefix>:finish_URL:<bucket>`` (``admitted``, ``concluded``,
``task_pool:fp`` likewise), so the 1,024 buckets of one set hash to ~1,000 slots and
spread over every master.

**A batch is one pipelined round trip per node touched**, sent to all nodes before any
reply is read. The slot map comes from ``CLUSTER SLOTS`` (:class:`SlotMap`, our own:
redis-py's ``RedisCluster`` keeps one too, but its pipeline re-packs every command and
parses every reply in Python, which is what ``dedupnet.adapters.storage.store`` exists to avoid; it is
still used for the admin calls, ``Store.redis``). A command answered ``-MOVED`` makes us
reload the map and send it again to the new owner; ``-ASK`` sends it to the importing
node behind ``ASKING``; ``-TRYAGAIN``, ``-CLUSTERDOWN``, ``-LOADING`` and a node that
cannot be reached are retried after the store's back-off, and only the commands of the
nodes that failed are sent again (safe: batches are idempotent, see dedupnet/adapters/storage/store.py).
When the back-off is spent the batch raises
:class:`~dedupnet.codec.errors.StoreUnavailable`; the daemons log it and keep retrying
(``runtime.until_stored``), so a dead master stalls progress and loses nothing.

**Transactions across slots.** One event's writes are one MULTI/EXEC on a single
server (all of them or none). On a cluster a MULTI/EXEC must stay in one slot, and an
event writes both its daemon's tagged keys and fingerprint buckets on other slots. So
the transaction runs on the daemon's home slot and carries, in the same MULTI, a redo
record ``{<prefix>}:redo`` (a hash: transaction id -> the RESP of the commands on other
slots); once EXEC has committed those commands are sent to their nodes, then the record
is deleted (in the next transaction's MULTI, not a round trip of its own). A redo
record left behind (a crash or a node down in between) is replayed before this store's
next batch and by any store opened on the prefix, before anything reads: so every read after a restart sees all of an event's writes or none, as on one
server. Only the commands of a transaction that leave the home slot go through the redo
record; they must be idempotent (SADD/SREM of fingerprints, the crawler's min-depth
script), which they are. Within a daemon the reactor awaits each event's writes before
the next look-up, so the daemon itself never sees half an event.
"""

from dedupnet.adapters.storage.redis_cluster.plan import (
    REDO, Pause, Plan, Refresh, Wave, execute_plan, replay_redo, run_commands,
)
from dedupnet.adapters.storage.redis_cluster.slots import (
    SLOTS,
    Addr,
    ClusterBatch,
    SlotMap,
    admin_client,
    bucket_slots,
    cluster_seeds,
    merged_info,
    slot_of,
    untagged,
)
from dedupnet.adapters.storage.redis_cluster.stores import AsyncClusterStore, ClusterStore

__all__ = [
    "REDO", "SLOTS", "Addr", "AsyncClusterStore", "ClusterBatch", "ClusterStore", "Pause", "Plan", "Refresh",
    "SlotMap", "Wave", "admin_client", "bucket_slots", "cluster_seeds", "execute_plan", "merged_info",
    "replay_redo", "run_commands", "slot_of", "untagged",
]
