"""Shared fixtures: one real (embedded) Redis server per test session, a fresh key
prefix per test so tests never see each other's pools; the crawler tests' web
(tests/crawling.py) and a lab of network namespaces (tests/netns.py) for the tests
that ask for them."""

import itertools
import os

import pytest
import trio

from dedupnet.adapters.storage.embedded import EmbeddedRedis
from dedupnet.adapters.storage.store import Store

from . import netns
from .crawling import HOSTS, Web
from .netns import Lab
from .procs import server_processes

_prefixes = itertools.count()

#: The slow tier (``make test`` runs it, ``make test-fast`` leaves it out): files whose
#: tests run whole clusters of daemon processes, network namespaces, a browser or long
#: seeded runs. A single slow test elsewhere is marked ``@pytest.mark.slow`` where it is.
SLOW_FILES = frozenset({
    "test_alerts.py", "test_bench_frontier.py", "test_cli_daemons.py", "test_common_mistakes.py", "test_daemons.py",
    "test_deploy_guide.py", "test_exposure.py", "test_faults.py", "test_frontier_crawl.py", "test_fuzz_daemons.py",
    "test_liveness.py", "test_local_exit.py", "test_netns.py", "test_operator_errors.py", "test_redis_cluster.py",
    "test_relay.py", "test_scrapy.py", "test_scrapy_exit.py", "test_sim.py", "test_simproc.py", "test_status_page.py",
    "test_sweep.py", "test_tls.py",
})

#: The longest files (docs/BENCHMARKS.md, "The test suite"), first: ``make test``'s
#: workers take a file at a time in this order, so none is left running a long one alone
#: at the end. The rest keep their order.
LONGEST_FIRST = (
    "test_faults.py", "test_sim.py", "test_simulate.py", "test_relay.py", "test_operator_errors.py",
    "test_simproc.py", "test_frontier.py", "test_scrapy.py", "test_redis_cluster.py", "test_deploy_guide.py",
    "test_local_exit.py", "test_liveness.py", "test_netns.py", "test_sites.py", "test_fuzz_daemons.py",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session", autouse=True)
def no_server_left_behind():
    """Set up first, torn down last: after every other fixture of the session has
    stopped its servers, no Redis server may remain a child of the test process."""
    yield
    me = os.getpid()
    left = server_processes(lambda ppid, cwd, cmdline: ppid == me)
    assert left == [], f"Redis servers left behind by the tests: {left}"


@pytest.fixture(scope="session")
def redis_url():
    """``DEDUPNET_TEST_REDIS`` points the tests at a server of your own; by default
    the project starts its embedded one (non-persistent) and stops it at the end."""
    url = os.environ.get("DEDUPNET_TEST_REDIS")
    if url:
        yield url
        return
    with EmbeddedRedis() as url:
        yield url


@pytest.fixture
def prefix():
    return f"t{os.getpid()}-{next(_prefixes)}"


@pytest.fixture
def store(redis_url, prefix):
    s = Store(redis_url, prefix)
    yield s
    s.delete_prefix()
    s.close()


@pytest.fixture
async def web():
    """The crawler tests' tiny web (tests/crawling.py): a site on each address of
    ``HOSTS``, served until the test ends."""
    w = Web()
    async with trio.open_nursery() as nursery:
        for name, host in HOSTS.items():
            await w.add(nursery, name, host)
        yield w
        nursery.cancel_scope.cancel()


@pytest.fixture
def lab():
    """Network namespaces for the test (tests/netns.py), all removed when it ends; the
    test is skipped, with the reason, where they cannot be built."""
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    netns.remove_stale()
    lab = Lab()
    try:
        yield lab
    finally:
        problems = lab.close()
        left = [ns for ns in netns.list_namespaces() if ns.startswith(lab.tag + "-")]
        assert not left, f"namespaces left behind: {left}"
        assert not problems, problems
