"""The local host role (paper §1.1): the crawler's side of the protocol.

Holds ``finish_URL``, ``task_pool`` and ``URL_pool`` and performs the local de-dup
of §2.2 before anything leaves the host.
"""
