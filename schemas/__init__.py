"""JSON Schemas of every message dedupnet puts on the wire (installed as ``dedupnet.schemas``).

The codec compiles these files into its validators, so they are the single source
of truth for the wire format; see docs/PROTOCOL.md.
"""
