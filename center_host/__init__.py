"""The center host role (paper §1.1): one per LAN, the LAN's gateway to other networks.

Holds ``task_URL``, ``local_reduce_pool`` and ``dist_reduce_pool``; runs the LAN
de-dup of §2.3 and the cross-network de-dup of §2.4 (the core in protocol.py, the
daemon in daemon.py).
"""
