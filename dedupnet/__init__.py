"""dedupnet: a Redis-based URL de-duplication protocol gateway for distributed crawlers.

The protocol is the paper's (see docs/PROTOCOL.md, which cites its § numbers).
This package holds what local hosts and center hosts share: the frame and wire
format, URL fingerprints, the Redis store, the embedded Redis, config and the CLI.
"""

__version__ = "0.1.0"
