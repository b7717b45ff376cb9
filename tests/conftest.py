"""Shared fixtures: one real (embedded) Redis server per test session, a fresh key
prefix per test so tests never see each other's pools."""

import itertools
import os

import pytest

from dedupnet.adapters.embedded import EmbeddedRedis
from dedupnet.adapters.store import Store

from .procs import server_processes

_prefixes = itertools.count()


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
