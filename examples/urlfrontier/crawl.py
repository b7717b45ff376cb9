"""A crawler that knows nothing of dedupnet: a URLFrontier client as anyone writes one
from the stock .proto (stubs made by grpcio-tools), with httpx for fetching and the
standard library for links and robots.txt. Point it at a ``dedupnet local --frontier``
host and it crawls that host's share of the web:

    GetURLs -> fetch each URL -> PutURLs(discovered: the links found, known: the URL)

Links are ``<a href>`` resolved against ``<base href>`` or the page; a redirect's
``Location`` is a link; a 503 is tried again a few times, then left to come back when
its lease ends. It runs until SIGTERM or Ctrl-C, then prints what it did on one line.

    python examples/urlfrontier/crawl.py --frontier 127.0.0.1:7071 --seed http://example.com/
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.robotparser
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from pathlib import Path

import grpc
import httpx
from grpc_tools import protoc

PROTO = Path(__file__).resolve().parents[2] / "local_host" / "frontier" / "urlfrontier" / "urlfrontier.proto"
FAIL = 2  # AckMessage.Status
TRIES = 5  # of a URL that answers 503


def stubs(proto: Path):
    """``(messages, services)`` compiled from ``proto`` into a temporary directory."""
    out = Path(tempfile.mkdtemp(prefix="urlfrontier-stubs-"))
    include = Path(protoc.__file__).parent / "_proto"
    if protoc.main(["protoc", f"-I{proto.parent}", f"-I{include}", f"--python_out={out}",
                    f"--grpc_python_out={out}", str(proto)]) != 0:
        raise SystemExit(f"grpcio-tools could not compile {proto}")
    sys.path.insert(0, str(out))
    return importlib.import_module("urlfrontier_pb2"), importlib.import_module("urlfrontier_pb2_grpc")


class Anchors(HTMLParser):
    """The ``<base href>`` and every ``<a href>`` of a page, as written."""

    def __init__(self):
        super().__init__()
        self.base: str | None = None
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        href = dict(attrs).get("href")
        if href is None:
            return
        if tag == "a":
            self.hrefs.append(href)
        elif tag == "base" and self.base is None:
            self.base = href


def links(url: str, html: str) -> list[str]:
    page = Anchors()
    page.feed(html)
    page.close()
    base = urllib.parse.urljoin(url, page.base) if page.base else url
    out = []
    for href in page.hrefs:
        try:
            target = urllib.parse.urldefrag(urllib.parse.urljoin(base, href.strip())).url
        except ValueError:  # e.g. an unclosed IPv6 bracket
            continue
        if target.partition(":")[0].lower() in ("http", "https"):
            out.append(target)
    return out


class Crawler:
    def __init__(self, pb, stub, *, bind: str | None, workers: int, lease: int, per_queue: int):
        self.pb, self.stub = pb, stub
        self.params = pb.GetParams(max_urls_per_queue=per_queue, max_queues=0, delay_requestable=lease)
        transport = httpx.HTTPTransport(local_address=bind, retries=0) if bind else None
        self.http = httpx.Client(transport=transport, timeout=30.0, follow_redirects=False)
        self.pool = ThreadPoolExecutor(workers)
        self.robots: dict[str, urllib.robotparser.RobotFileParser] = {}
        self.robots_lock = threading.Lock()
        self.stop = threading.Event()
        self.fetched = self.given_up = self.failed_acks = 0

    def allowed(self, url: str) -> bool:
        origin = "{0.scheme}://{0.netloc}".format(urllib.parse.urlsplit(url))
        with self.robots_lock:  # one robots.txt request per site
            rules = self.robots.get(origin)
            if rules is None:
                rules = urllib.robotparser.RobotFileParser()
                try:
                    answer = self.http.get(origin + "/robots.txt")
                    rules.parse(answer.text.splitlines() if answer.status_code == 200 else [])
                except httpx.HTTPError:
                    rules.parse([])
                self.robots[origin] = rules
        return rules.can_fetch("*", url)

    def visit(self, url: str) -> list[str] | None:
        """The URLs ``url`` leads to; None if it could not be fetched (not reported, so
        it is handed out again when its lease ends)."""
        if not self.allowed(url):
            return []
        for attempt in range(TRIES):
            try:
                answer = self.http.get(url)
            except httpx.HTTPError:
                answer = None
            if answer is not None and answer.status_code != 503:
                break
            time.sleep(0.05 * (attempt + 1))
        else:
            self.given_up += 1
            return None
        self.fetched += 1
        if answer.is_redirect:
            return [urllib.parse.urljoin(url, answer.headers["location"])]
        if answer.status_code == 200 and answer.headers.get("content-type", "").startswith("text/html"):
            return links(url, answer.content.decode("utf-8", errors="replace"))
        return []

    def put(self, discovered: list[str], known: list[str]) -> None:
        pb = self.pb
        items = [pb.URLItem(discovered=pb.DiscoveredURLItem(info=pb.URLInfo(url=u))) for u in discovered]
        items += [pb.URLItem(known=pb.KnownURLItem(info=pb.URLInfo(url=u))) for u in known]
        for ack in self.stub.PutURLs(iter(items), timeout=120):
            self.failed_acks += ack.status == FAIL

    def run(self) -> None:
        while not self.stop.is_set():
            urls = [info.url for info in self.stub.GetURLs(self.params, timeout=60)]
            if not urls:
                self.stop.wait(0.05)
                continue
            found = list(self.pool.map(self.visit, urls))
            self.put([u for out in found if out for u in out],
                     [u for u, out in zip(urls, found) if out is not None])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frontier", required=True, metavar="HOST:PORT", help="the URLFrontier service")
    ap.add_argument("--bind", metavar="IP", help="the source address of the crawler's requests")
    ap.add_argument("--seed", action="append", default=[], metavar="URL", help="put as discovered first")
    ap.add_argument("--workers", type=int, default=16, help="requests in flight at once (default %(default)s)")
    ap.add_argument("--lease", type=int, default=60,
                    help="seconds a URL handed out is kept for this crawler (default %(default)s)")
    ap.add_argument("--per-queue", type=int, default=50, help="URLs per site per GetURLs (default %(default)s)")
    ap.add_argument("--proto", type=Path, default=PROTO, help="the URLFrontier .proto (default: the project's)")
    args = ap.parse_args(argv)
    pb, services = stubs(args.proto)
    channel = grpc.insecure_channel(args.frontier)
    crawler = Crawler(pb, services.URLFrontierStub(channel), bind=args.bind, workers=args.workers,
                      lease=args.lease, per_queue=args.per_queue)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: crawler.stop.set())
    grpc.channel_ready_future(channel).result(timeout=60)
    if args.seed:
        crawler.put(args.seed, [])
    print(f"crawling the tasks of {args.frontier}", flush=True)
    crawler.run()
    print(f"fetched {crawler.fetched}, given up {crawler.given_up}, FAIL acks {crawler.failed_acks}", flush=True)


if __name__ == "__main__":
    main()
