"""Adapters to the operator: counters and ``/metrics`` (metrics, metric_catalog,
levels), the status page, and the crawl census of ``dedupnet status --cluster``."""
