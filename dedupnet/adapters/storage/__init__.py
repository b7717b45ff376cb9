"""Adapters to Redis: the store and its trio driver, Redis Cluster, the Bloom filter,
aged sets, watermarks, writes made once, the embedded server and its AOF repair."""
