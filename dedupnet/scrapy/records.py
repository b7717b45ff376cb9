"""What a discovered Scrapy request carries beyond its URL, kept for the task that will
fetch it.

A task comes back from the protocol as a plain URL, perhaps to another host. So that
the spider's own host can give it back its callback, errback, ``cb_kwargs`` and
priority, the scheduler keeps them in the host's hash ``<prefix>:scrapy_requests``
(8-byte fingerprint -> JSON ``{cb, eb, kw, p}``) when it pushes the URL, and reads them
when it takes the task. Callbacks are kept by name, so only the spider's own methods
survive the trip; ``meta`` is not kept.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from redis.exceptions import RedisError
from scrapy import Request

from dedupnet.adapters.storage.store import Store
from dedupnet.adapters.storage.resp import fingerprint_fields
from dedupnet.codec.errors import DedupnetError
from dedupnet.codec.urls import fingerprint_many
from dedupnet.scrapy.leases import TASK_META, Lease

log = logging.getLogger("dedupnet.scrapy")

#: Hash 8-byte fingerprint -> JSON {cb, eb, kw, p} of discovered requests with more than a URL.
REQUESTS = "scrapy_requests"


def record_of(request: Request, spider, stats) -> bytes | None:
    """What a task of this URL needs beyond its URL (callback, errback, cb_kwargs,
    priority), as JSON; None when it is a plain request to ``parse``."""
    rec: dict[str, Any] = {}
    for key, fn in (("cb", request.callback), ("eb", request.errback)):
        if fn is None:
            continue
        name = getattr(fn, "__name__", None)
        if getattr(fn, "__self__", None) is not spider or not name or name.startswith("__"):
            stats.inc_value("dedupnet/callback_not_kept")
            continue
        if not (key == "cb" and name == "parse"):
            rec[key] = name
    if request.cb_kwargs:
        try:
            orjson.dumps(request.cb_kwargs)
            rec["kw"] = request.cb_kwargs
        except TypeError:
            stats.inc_value("dedupnet/cb_kwargs_not_kept")
    if request.priority:
        rec["p"] = request.priority
    return orjson.dumps(rec) if rec else None


def records_of(store: Store, urls: list[str], stats) -> dict[str, dict]:
    """The kept records of these task URLs (url -> record); none if Redis fails: the
    tasks then go to ``parse``."""
    fields = fingerprint_fields(fingerprint_many(urls))
    try:
        values = store.command(b"HMGET", store.key(REQUESTS), *fields)
    except (RedisError, DedupnetError, OSError) as e:
        log.warning("dedupnet: reading callbacks failed: %s (tasks go to parse)", e)
        return {}
    out = {}
    for url, value in zip(urls, values):
        if value:
            try:
                out[url] = orjson.loads(value)
            except orjson.JSONDecodeError:
                stats.inc_value("dedupnet/bad_input/request_record")
    return out


def task_request(lease: Lease, record: dict | None, spider) -> Request:
    """The request that fetches a task, with what its record kept."""
    kw: dict[str, Any] = {}
    if record:
        for key, arg in (("cb", "callback"), ("eb", "errback")):
            name = record.get(key)
            if name:
                fn = getattr(spider, name, None)
                if callable(fn):
                    kw[arg] = fn
                else:
                    log.warning("dedupnet: spider has no method %r (task %s): default used", name, lease.url)
        if isinstance(record.get("kw"), dict):
            kw["cb_kwargs"] = record["kw"]
        if isinstance(record.get("p"), int):
            kw["priority"] = record["p"]
    return Request(lease.url, meta={TASK_META: lease.eid.decode()}, **kw)
