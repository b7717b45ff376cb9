"""Deterministic simulation: the protocol's own sans-I/O cores (center_host/protocol.py,
local_host/protocol.py) driven by one seeded scheduler on a virtual clock, in one thread.

What is modelled, and what is real:

* real: both cores, the wire codec (every message is encoded and decoded), the
  synthetic web's link graph (dedupnet/harness/web.py, no HTTP);
* modelled: the network (:mod:`.net`: TCP connections with latency, resets,
  partitions, half-open links, heartbeats), Redis (:mod:`.store`: one transaction per
  event, ``appendfsync everysec`` losses, wipes), the crawler (:mod:`.crawler`) and the
  processes (:mod:`.nodes`: crash, restart, freeze, never return).

The adapters in :mod:`.nodes` follow the contract in docs/ARCHITECTURE.md ("The core and
its adapter") exactly as the trio daemons do; :mod:`.check` judges the history and
:mod:`.run` puts it together (``dedupnet simulate``).
"""
