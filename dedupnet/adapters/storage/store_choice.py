"""Which store a Redis URL gets: ``redis://`` or ``unix://`` is one server
(:class:`~dedupnet.adapters.storage.store.Store`, driven on trio by
:class:`~dedupnet.adapters.storage.aio.AsyncStore`); ``redis+cluster://`` is a Redis Cluster
(:class:`~dedupnet.adapters.storage.redis_cluster.ClusterStore` and its trio driver, the same API
routed per slot). The choice lives here, above the three modules, so that none of them
imports another one that imports it back (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from typing import Any

from dedupnet.adapters.storage.aio import AsyncStore
from dedupnet.adapters.storage.redis_cluster import AsyncClusterStore, ClusterStore
from dedupnet.adapters.storage.store import LEGACY_BUCKET_BITS, Store, is_cluster_url

__all__ = ["store_for", "on_trio"]


def store_for(url: str, prefix: str, **options: Any) -> Store:
    """The store of ``url`` under ``prefix`` (``Store``'s keyword options). A cluster's
    buckets are spread over its masters by name: it keeps the layout it always had."""
    if is_cluster_url(url):
        options["bucket_bits"] = options.get("bucket_bits") or LEGACY_BUCKET_BITS
        return ClusterStore(url, prefix, **options)
    return Store(url, prefix, **options)


def on_trio(store: Store, **options: Any) -> AsyncStore:
    """``store`` driven from trio (``AsyncStore``'s keyword options)."""
    return (AsyncClusterStore if isinstance(store, ClusterStore) else AsyncStore)(store, **options)
