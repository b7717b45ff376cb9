"""The URLFrontier service of a local host (``dedupnet local --frontier HOST:PORT``):
any crawler with a URLFrontier client crawls the host's tasks and feeds what it finds
into the protocol. docs/FRONTIER.md says what each call does here.

The messages and the service come from ``urlfrontier/urlfrontier.proto`` (beside this module), compiled when
this module is imported (grpcio-tools, in the ``frontier`` extra): the .proto is the only
copy, and no generated code ties the install to one protobuf release. gRPC's own server
runs the calls in its worker threads; they use the host's Redis through a synchronous
:class:`~dedupnet.adapters.storage.store.Store` (local_host/frontier/queues.py), never trio.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

try:
    import grpc
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError("the URLFrontier service needs the frontier extra: pip install 'dedupnet[frontier]'") from e

from dedupnet.adapters.monitor.metrics import Counters
from dedupnet.codec.errors import BadURL

from .queues import FrontierQueues, Get

log = logging.getLogger("dedupnet.frontier")

#: The one crawl a dedupnet deployment is (an empty crawl id means it too).
CRAWL_ID = "DEFAULT"
#: Items of a PutURLs stream handled together (one Redis round trip for many).
PUT_BATCH = 1000
#: gRPC worker threads: each open stream holds one.
WORKERS = 32
PROTO = "local_host/frontier/urlfrontier/urlfrontier.proto"


def _compile():
    """The message classes and the service from the .proto (found from the directory
    that holds ``local_host``, which need not be on sys.path)."""
    root = str(Path(__file__).resolve().parents[2])
    added = root not in sys.path
    if added:
        sys.path.append(root)
    try:
        return grpc.protos_and_services(PROTO)
    finally:
        if added:
            sys.path.remove(root)


pb, services = _compile()
_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_END = object()


def _ours(crawl_id: str) -> bool:
    return crawl_id in ("", CRAWL_ID)


def _unsupported(context, what: str):
    context.abort(grpc.StatusCode.UNIMPLEMENTED, f"dedupnet's URLFrontier service does not support {what}")


class URLFrontier(services.URLFrontierServicer):
    def __init__(self, queues: FrontierQueues, counters: Counters, node: Callable[[], str]):
        self.queues = queues
        self.counters = counters
        self.node = node

    def _check_crawl(self, crawl_id: str, context) -> None:
        if not _ours(crawl_id):
            self.counters.inc("frontier_bad_input", reason="crawl_id")
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"no crawl {crawl_id!r}: this frontier serves one crawl, {CRAWL_ID!r} (or '')")

    # -- the crawler's calls ---------------------------------------------------------------
    def GetURLs(self, request, context) -> Iterator:
        if request.WhichOneof("item") == "crawlID":
            self._check_crawl(request.crawlID, context)
        params = Get(request.max_urls_per_queue, request.max_queues, request.key, request.delay_requestable)
        for url, key in self.queues.get(params):
            yield pb.URLInfo(url=url, key=key, crawlID=CRAWL_ID)

    def PutURLs(self, request_iterator, context) -> Iterator:
        for items in _batches(request_iterator, self.counters):
            discovered = [(i, it.discovered.info) for i, it in enumerate(items) if it.WhichOneof("item") == "discovered"]
            known = [(i, it.known.info) for i, it in enumerate(items) if it.WhichOneof("item") == "known"]
            statuses = [pb.AckMessage.FAIL] * len(items)  # an item with neither: FAIL
            for part, put in ((discovered, self.queues.put_discovered), (known, self.queues.put_known)):
                if part:
                    done = put([(info.url, _ours(info.crawlID)) for _, info in part])
                    for (i, _), status in zip(part, done):
                        statuses[i] = status
            for item, status in zip(items, statuses):
                yield pb.AckMessage(ID=item.ID or _url_of(item), status=status)

    def PutDiscovered(self, request_iterator, context) -> Iterator:
        for batches in _batches(request_iterator, self.counters):
            for batch in batches:
                statuses = self.queues.put_discovered([(info.url, _ours(info.crawlID)) for info in batch.items])
                yield pb.BatchAck(ID=batch.ID, statuses=statuses)

    # -- inspection and control ------------------------------------------------------------
    def ListNodes(self, request, context):
        return pb.StringList(values=[self.node()])

    def ListCrawls(self, request, context):
        return pb.StringList(values=[CRAWL_ID])

    def ListQueues(self, request, context):
        self._check_crawl(request.crawlID, context)
        census = self.queues.census()
        blocked = self.queues.blocked_now()
        names = sorted(q for q, (waiting, in_flight) in census.items()
                       if request.include_inactive or (waiting + in_flight and q not in blocked))
        size = request.size or 100
        page = names[request.start : request.start + size]
        return pb.QueueList(values=page, total=len(names), start=request.start, size=len(page), crawlID=CRAWL_ID)

    def GetStats(self, request, context):
        self._check_crawl(request.crawlID, context)
        census = self.queues.census()
        if request.key:
            census = {request.key: census.get(request.key, [0, 0])}
        waiting = sum(w for w, _ in census.values())
        in_flight = sum(f for _, f in census.values())
        counts = {"active_queues": sum(1 for w, f in census.values() if w + f)}
        return pb.Stats(size=waiting, inProcess=in_flight, counts=counts, numberOfQueues=len(census),
                        crawlID=CRAWL_ID)

    def GetURLStatus(self, request, context):
        self._check_crawl(request.crawlID, context)
        try:
            status = self.queues.status_of(request.url)
        except BadURL as e:
            self.counters.inc("frontier_bad_input", reason=e.reason)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a URL to crawl: {e}")
        if status is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"{request.url} is not a task of this host, nor crawled here")
        info = pb.URLInfo(url=request.url, crawlID=CRAWL_ID)
        if status == "done":
            return pb.URLItem(known=pb.KnownURLItem(info=info), ID=request.url)
        return pb.URLItem(discovered=pb.DiscoveredURLItem(info=info), ID=request.url)

    def CountURLs(self, request, context):
        self._check_crawl(request.crawlID, context)
        if request.HasField("filter"):
            _unsupported(context, "CountURLs with a filter")
        census = self.queues.census()
        if request.key:
            census = {request.key: census.get(request.key, [0, 0])}
        return pb.Long(value=sum(w + f for w, f in census.values()))

    def SetDelay(self, request, context):
        self._check_crawl(request.crawlID, context)
        self.queues.set_delay(request.key, request.delay_requestable)
        return pb.Empty()

    def BlockQueueUntil(self, request, context):
        self._check_crawl(request.crawlID, context)
        self.queues.block_until(request.key, request.time)
        return pb.Empty()

    def SetActive(self, request, context):
        self.queues.active = request.state
        log.info("URLFrontier service %s", "active" if request.state else "inactive: GetURLs hands out nothing")
        return pb.Empty()

    def GetActive(self, request, context):
        return pb.Boolean(state=self.queues.active)

    def SetLogLevel(self, request, context):
        logging.getLogger(request.package or None).setLevel(_LEVELS.get(request.level, logging.INFO))
        return pb.Empty()

    # -- what does not map onto dedupnet ---------------------------------------------------
    def DeleteCrawl(self, request, context):
        _unsupported(context, "DeleteCrawl: the crawl's URLs are recorded in every network's pools")

    def DeleteQueue(self, request, context):
        _unsupported(context, "DeleteQueue: its URLs were admitted by the protocol and would be lost to it; "
                              "BlockQueueUntil stops a queue")

    def SetCrawlLimit(self, request, context):
        _unsupported(context, "SetCrawlLimit")

    def ListURLs(self, request, context):
        _unsupported(context, "ListURLs")

    def PurgeURLs(self, request, context):
        _unsupported(context, "PurgeURLs: URLs age out of finish_URL by the host's recrawl_after")


def _url_of(item) -> str:
    kind = item.WhichOneof("item")
    return getattr(item, kind).info.url if kind else ""


def _batches(requests, counters: Counters) -> Iterator[list]:
    """The items of a client stream in lists of what has arrived (at most ``PUT_BATCH``):
    one Redis round trip for many items while the client sends fast, no wait while it
    sends slowly. A reader thread takes the items; a stream that breaks off ends the
    batches after the items that came (each of them is handled and acknowledged)."""
    inbox: queue.Queue = queue.Queue(maxsize=2 * PUT_BATCH)

    def read() -> None:
        try:
            for item in requests:
                inbox.put(item)
        except grpc.RpcError:
            counters.inc("frontier_streams_broken")
        finally:
            inbox.put(_END)

    threading.Thread(target=read, name="urlfrontier-put", daemon=True).start()
    while True:
        item = inbox.get()
        if item is _END:
            return
        batch = [item]
        while len(batch) < PUT_BATCH:
            try:
                item = inbox.get_nowait()
            except queue.Empty:
                break
            if item is _END:
                yield batch
                return
            batch.append(item)
        yield batch


def start_server(queues: FrontierQueues, counters: Counters, host: str, port: int) -> tuple[grpc.Server, int]:
    """A started gRPC server on ``host:port`` (port 0: a free one); returns it and its port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="urlfrontier"),
                         maximum_concurrent_rpcs=WORKERS)
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound: list[int] = []
    services.add_URLFrontierServicer_to_server(URLFrontier(queues, counters, lambda: f"{host}:{bound[0]}"), server)
    bound.append(server.add_insecure_port(where))
    if not bound[0]:
        raise OSError(f"the URLFrontier service cannot listen on {where}")
    server.start()
    log.info("URLFrontier service on %s:%d", host, bound[0])
    return server, bound[0]
