"""The I/O adapters, a room per what they adapt to: ``storage`` (Redis: the store, its trio
driver, Redis Cluster, the Bloom filter, the embedded server), ``net`` (TCP/TLS framing,
listeners, interfaces, LAN discovery) and ``monitor`` (metrics, the status page, the crawl
census); here, the reactor that runs a sans-I/O core (``runtime``), child processes and the
data directory's lock. They import only the codec and each other (docs/ARCHITECTURE.md)."""
