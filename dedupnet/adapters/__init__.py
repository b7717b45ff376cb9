"""The I/O adapters: Redis (store, its trio driver, Redis Cluster, the Bloom filter), TCP/TLS
framing, the reactor that runs a sans-I/O core, the embedded server, interfaces, LAN discovery,
metrics. They import only the codec (docs/ARCHITECTURE.md)."""
