"""One declaration per metric (dedupnet/adapters/monitor/metric_catalog.py): every name the
daemons count is declared there with its type and labels, every declaration is used,
docs/METRICS.md's reference is the one generated from it, and the levels gauges
(dedupnet/adapters/monitor/levels.py) are read from the daemons' status at each scrape: real
daemons, real Redis, real HTTP on loopback."""

import ast
import pathlib
import random
import re

import httpx
import trio
from trio.testing import MockClock

from dedupnet.adapters.monitor.levels import LEVELS, LEVELS_TIMEOUT, Levels, levels_of
from dedupnet.adapters.monitor.metric_catalog import METRICS, reference_markdown
from dedupnet.adapters.monitor.metrics import Counters, render_prometheus
from dedupnet.harness.cluster import open_cluster

from .helpers import until

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: What the daemons run: the harness (simulations, baselines) counts its own names.
PRODUCT = [p for d in ("center_host", "local_host", "dedupnet") for p in (ROOT / d).rglob("*.py")
           if "harness" not in p.parts]
HTTP = ("127.0.0.1", 0)


def counted() -> dict[tuple[str, str], set[str]]:
    """``{(name, kind): labels}`` of every ``.inc(...)`` / ``.set_gauge(...)`` in the product."""
    found: dict[tuple[str, str], set[str]] = {}
    for path in PRODUCT:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("inc", "set_gauge") and node.args):
                continue
            first = node.args[0]
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            assert isinstance(first, ast.Constant) and isinstance(first.value, str), (
                f"{where}: a metric name must be a literal, so that this test sees it")
            kind = "counter" if node.func.attr == "inc" else "gauge"
            labels = {k.arg for k in node.keywords if k.arg not in ("amount", "value")}
            found.setdefault((first.value, kind), set()).update(labels)
    return found


def test_every_counted_metric_is_declared_with_its_type_and_labels():
    found = counted()
    assert len(found) > 50  # the scan sees the daemons' counters
    for (name, kind), labels in sorted(found.items()):
        declared = METRICS.get(name)
        assert declared is not None, f"{name} is counted but not declared in dedupnet/adapters/monitor/metric_catalog.py"
        assert declared.kind == kind, f"{name} is counted as a {kind}, declared as a {declared.kind}"
        assert labels <= set(declared.labels), f"{name}: labels {sorted(labels)} not all declared {declared.labels}"


def test_every_declared_metric_is_counted_or_a_level():
    used = {name for name, _ in counted()} | LEVELS | {"crawl_verdict"}
    assert set(METRICS) - used == set(), "declared but never counted: drop them from the catalog"
    for name in LEVELS | {"crawl_verdict"}:
        assert METRICS[name].kind == "gauge"


def test_names_follow_prometheus_conventions():
    for m in METRICS.values():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", m.name) and not m.name.endswith("_total"), m.name
        assert m.help.endswith(".") and "\n" not in m.help, m.name
        words = m.name.split("_")
        for unit in ("bytes", "seconds"):  # a unit is the name's last word
            assert unit not in words or words[-1] == unit, f"{m.name}: put the unit last"
        assert m.exposed.endswith("_total") == (m.kind == "counter")


def test_metrics_reference_in_docs_is_generated_from_the_catalog():
    text = (ROOT / "docs" / "METRICS.md").read_text()
    m = re.search(r"<!-- reference: generated.*?-->\n(.*?)<!-- end of the reference -->", text, re.S)
    assert m, "docs/METRICS.md lost its reference markers"
    assert m.group(1) == reference_markdown(), (
        "docs/METRICS.md's reference is out of date: paste `python -m dedupnet.adapters.monitor.metric_catalog` between its markers")


def test_replace_gauges_drops_the_series_that_are_gone():
    c = Counters()
    c.set_gauge("member_up", 1, member="net:2", kind="peer")
    c.set_gauge("member_up", 1, member="net:3", kind="peer")
    c.set_gauge("durable_acks", 1)
    c.replace_gauges({"member_up"}, [("member_up", {"member": "net:3", "kind": "peer"}, 0)])
    assert c.gauges() == {'member_up{member="net:3",kind="peer"}': 0, "durable_acks": 1}
    assert "net:2" not in render_prometheus(c)


async def test_levels_say_store_down_when_the_status_fails_or_hangs():
    """Redis refusing (the status raises) or hanging (it never returns): the scrape
    answers in bounded time with ``store_up 0`` and without stale levels."""
    counters = Counters()
    body = {"role": "host", "network": 1, "pools": {"task_pool": 3}, "sets_in_flight": {"unacked": 1},
            "connected": True, "crawler": None}
    answer = {"how": "ok"}

    async def status():
        if answer["how"] == "raise":
            raise ConnectionError("Connection refused")
        if answer["how"] == "hang":
            await trio.sleep_forever()
        return body

    levels = Levels(counters, status)
    async with trio.open_nursery() as nursery:
        await levels.refresh(nursery)
        assert counters.get_gauge("store_up") == 1 and counters.get_gauge("pool_entries", pool="task_pool") == 3
        answer["how"] = "raise"
        await levels.refresh(nursery)
        assert counters.get_gauge("store_up") == 0 and "pool_entries" not in render_prometheus(counters)
        assert counters.get_gauge("info", role="host", network=1) == 1  # what it is does not depend on Redis
        answer["how"] = "ok"
        await levels.refresh(nursery)
        assert counters.get_gauge("store_up") == 1
        answer["how"] = "hang"
        start = trio.current_time()
        await levels.refresh(nursery)
        assert trio.current_time() - start <= 2 * LEVELS_TIMEOUT + 0.01
        assert counters.get_gauge("store_up") == 0 and "pool_entries" not in render_prometheus(counters)
        nursery.cancel_scope.cancel()


test_levels_say_store_down_when_the_status_fails_or_hangs.clock = MockClock(autojump_threshold=0)  # type: ignore[attr-defined]


def test_levels_of_a_center_body():
    body = {"role": "center", "network": 1, "pools": {"task_URL": 2}, "sets_in_flight": {"dist": 2},
            "liveness": [{"member": "10.1.0.11", "kind": "host", "state": "down", "silent": None, "task_pool": 99},
                         {"member": "net:2", "kind": "peer", "state": "live", "silent": 0.5}],
            "sets": {"dist": {"oldest": 12.5}}, "frames_held": 0, "waiting_for": {"net:2": 2},
            "waiting_for_networks": {"net:2": 30}, "task_URL_per_host": {"": 4, "10.1.0.11": 6}}
    got = {(n, tuple(sorted(labels.items()))): v for n, labels, v in levels_of(body)}
    assert got[("member_up", (("kind", "host"), ("member", "10.1.0.11")))] == 0
    assert got[("member_up", (("kind", "peer"), ("member", "net:2")))] == 1
    assert got[("members", (("kind", "host"), ("state", "down")))] == 1
    assert got[("members", (("kind", "peer"), ("state", "late")))] == 0
    assert got[("reported_task_pool", (("host", "10.1.0.11"),))] == 99
    assert got[("task_urls", (("host", "none"),))] == 4
    assert got[("urls_waiting", (("network", "2"),))] == 30
    assert got[("sets_oldest_age_seconds", (("stage", "dist"),))] == 12.5
    assert {n for n, _ in got} <= LEVELS


def scrape_text(port: int) -> str:
    r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert r.status_code == 200
    return r.text


async def scrape(port: int) -> dict[str, float]:
    text = await trio.to_thread.run_sync(scrape_text, port)
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if not line.startswith("#")}


async def test_member_and_waiting_gauges_move_when_a_peer_network_goes_down(redis_url):
    """Network 2's center goes down: center 1's scrape shows it down and the URLs of
    network 2's sites waiting for it; back, they are taken and it is up again."""
    async with open_cluster(redis_url, 2, 1, set_size=100, prefix=f"lvl{random.random()}",
                            metrics=HTTP) as system:
        c1, h10 = system.centers[1], system.hosts["127.0.1.10"]
        up = 'dedupnet_member_up{member="net:2",kind="peer"}'
        m = await scrape(c1.http_port)
        assert m[up] == 1 and m['dedupnet_members{kind="peer",state="live"}'] == 1
        assert m['dedupnet_info{role="center",network="1"}'] == 1 and m["dedupnet_store_up"] == 1
        assert m['dedupnet_member_up{member="127.0.1.10",kind="host"}'] == 1
        host = await scrape(h10.http_port)
        assert host["dedupnet_center_connected"] == 1 and 'dedupnet_pool_entries{pool="task_pool"}' in host

        port2 = system.centers[2].port
        await system.kill("center2")
        await until(lambda: _value(c1.http_port, up, 0), poll=0.05)
        urls = [f"http://site{i}.example/p" for i in range(40)]
        await h10.store.run(h10.pools.push, urls)
        await until(lambda: _positive(c1.http_port, 'dedupnet_urls_waiting{network="2"}'), poll=0.05)
        m = await scrape(c1.http_port)
        assert m['dedupnet_members{kind="peer",state="down"}'] == 1

        await system.start_center(2, 2, port=port2)
        await until(lambda: _value(c1.http_port, up, 1), poll=0.05)
        await until(lambda: _absent(c1.http_port, 'dedupnet_urls_waiting{network="2"}'), poll=0.05)


async def _value(port, series, want) -> bool:
    return (await scrape(port)).get(series) == want


async def _positive(port, series) -> bool:
    return (await scrape(port)).get(series, 0) > 0


async def _absent(port, series) -> bool:
    return series not in await scrape(port)
