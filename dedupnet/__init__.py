"""dedupnet: a Redis-based URL de-duplication protocol gateway for distributed crawlers.

The protocol is the paper's (see docs/PROTOCOL.md, which cites its § numbers). The
package is in layers, and imports only go down (docs/ARCHITECTURE.md): ``codec`` (the
frame and the rules both roles share), ``adapters`` (Redis, TCP/TLS, the reactor, the
embedded server, metrics), then the roles (the top-level ``local_host`` and
``center_host`` packages), ``service`` (config and daemons), ``harness`` (simulations,
synthetic web, baselines), and the front ends ``cli`` and ``scrapy``.
"""

__version__ = "0.1.0"
