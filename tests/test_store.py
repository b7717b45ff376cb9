from urllib.parse import urlparse

import numpy as np
import pytest
import trio

from dedupnet.adapters.storage.aio import AsyncStore
from dedupnet.codec.errors import StoreUnavailable
from dedupnet.adapters.storage.store import FINISH_URL, MAX_BUCKET_BITS, MIN_BUCKET_BITS, URL_POOL, Batch, Store
from dedupnet.adapters.storage.resp import pack_command
from dedupnet.codec.backoff import Backoff
from dedupnet.codec.urls import fingerprint_many

rng = np.random.default_rng(7)


def random_fps(n):
    return rng.integers(0, 2**64, size=n, dtype=np.uint64)


def test_pack_command_is_resp():
    assert pack_command(b"SET", "k", 12) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n12\r\n"


def test_fingerprint_set_add_contains_remove(store):
    present = random_fps(5000)
    absent = random_fps(5000)
    assert store.fp_add(FINISH_URL, present) == 5000
    assert store.fp_add(FINISH_URL, present[:100]) == 0  # idempotent
    query = np.concatenate([absent, present])
    perm = rng.permutation(len(query))
    got = store.fp_contains(FINISH_URL, query[perm])
    expected = np.r_[np.zeros(5000, bool), np.ones(5000, bool)][perm]
    assert np.array_equal(got, expected)
    assert store.fp_count(FINISH_URL) == 5000
    assert store.fp_remove(FINISH_URL, present[:10]) == 10
    assert not store.fp_contains(FINISH_URL, present[:10]).any()


def test_fingerprint_extremes_and_duplicates_in_one_batch(store):
    edge = np.array([0, 1, 2**63, 2**64 - 1, 2**64 - 1, 12345], dtype=np.uint64)
    assert store.fp_add(FINISH_URL, edge) == 5
    assert store.fp_contains(FINISH_URL, edge).all()
    assert not store.fp_contains(FINISH_URL, edge ^ np.uint64(1 << 20)).any()
    assert store.fp_contains(FINISH_URL, np.empty(0, np.uint64)).shape == (0,)


def test_a_url_set_is_one_round_trip(store):
    fps = fingerprint_many([f"http://s{i % 50}.example/{i}" for i in range(1000)])
    before = store.round_trips
    store.fp_add(FINISH_URL, fps)
    store.fp_contains(FINISH_URL, fps)
    assert store.round_trips - before == 2


def test_buckets_are_compact_intsets_with_the_paper_name(store):
    store.fp_add(FINISH_URL, random_fps(3000))
    keys = [k.decode() for k in store.redis.scan_iter(match=f"{store.prefix}:finish_URL:*")]
    assert keys and all(k.startswith(f"{store.prefix}:finish_URL:") for k in keys)
    assert store.redis.object("encoding", keys[0]) == b"intset"


def test_prefixes_isolate_hosts_on_one_server(redis_url, store):
    other = Store(redis_url, store.prefix + "-other")
    try:
        fps = random_fps(100)
        store.fp_add(FINISH_URL, fps)
        assert not other.fp_contains(FINISH_URL, fps).any()
    finally:
        other.delete_prefix()
        other.close()


def test_stream_pool_keeps_taken_urls_until_done(store):
    store.ensure_group(URL_POOL, "dedup")
    store.ensure_group(URL_POOL, "dedup")  # idempotent
    urls = [f"http://a.example/{i}" for i in range(10)]
    store.stream_add(URL_POOL, urls)
    taken = store.stream_take(URL_POOL, "dedup", "h1", 6)
    assert [u for _, u in taken] == urls[:6]
    # Taken but not done: still in URL_pool, and handed back as pending after a restart.
    assert store.stream_len(URL_POOL) == 10
    assert store.stream_take(URL_POOL, "dedup", "h1", 100, pending=True) == taken
    assert store.stream_done(URL_POOL, "dedup", [i for i, _ in taken]) == 6
    assert store.stream_len(URL_POOL) == 4
    assert store.stream_take(URL_POOL, "dedup", "h1", 100, pending=True) == []
    assert [u for _, u in store.stream_take(URL_POOL, "dedup", "h1", 100)] == urls[6:]


def test_sequences_are_reserved_and_persisted(store):
    assert list(store.next_sequences(3)) == [1, 2, 3]
    assert list(store.next_sequences()) == [4]


def test_error_reply_does_not_desynchronise_the_batch(store):
    batch = store.batch()
    batch.add(b"SET", store.key("x"), b"1")
    batch.add(b"INCR", store.key("x") + "-no", b"extra-arg")  # wrong arity: error reply
    batch.add(b"GET", store.key("x"))
    ok, err, value = store.execute(batch)
    assert isinstance(err, Exception) and value == b"1"


def test_unreachable_redis_gives_clear_error_after_backoff():
    s = Store("redis://127.0.0.1:1/0", "x", retry=Backoff(first=0.01, cap=2.0, attempts=3))
    with pytest.raises(StoreUnavailable, match="unreachable"):
        s.fp_contains(FINISH_URL, random_fps(3))
    assert s.reconnects == 2


def test_store_survives_a_server_restart(tmp_path):
    from dedupnet.adapters.storage.embedded import EmbeddedRedis

    server = EmbeddedRedis(persistent=True, data_dir=tmp_path)
    url = server.start()
    try:
        s = Store(url, "p", retry=Backoff(first=0.05, cap=0.2, attempts=20))
        fps = random_fps(100)
        s.fp_add(FINISH_URL, fps)
        port = urlparse(url).port
        server.stop()
        server = EmbeddedRedis(persistent=True, data_dir=tmp_path, port=port)
        server.start()
        # The old connection died with the server; the store reconnects on its own.
        assert s.fp_contains(FINISH_URL, fps).all()
    finally:
        server.stop()


async def test_async_store_runs_calls_in_threads(store):
    astore = AsyncStore(store)
    fps = random_fps(50)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(astore.fp_add, FINISH_URL, fps)
    assert (await astore.fp_contains(FINISH_URL, fps)).all()
    assert astore.prefix == store.prefix


@pytest.mark.parametrize("bits", [8, 16, 24])
def test_every_allowed_bucket_width_keeps_full_fingerprints(redis_url, bits):
    s = Store(redis_url, f"bits{bits}", bucket_bits=bits)
    try:
        fps = np.array([0, 2**64 - 1, 2**63 + 12345, 2**(64 - bits) - 1], dtype=np.uint64)
        s.fp_add(FINISH_URL, fps)
        assert s.fp_contains(FINISH_URL, fps).all()
        assert not s.fp_contains(FINISH_URL, fps ^ np.uint64(1)).any()
    finally:
        s.delete_prefix()


def test_too_few_bucket_bits_are_refused(redis_url):
    with pytest.raises(ValueError, match="8..24"):
        Store(redis_url, "x", bucket_bits=7)


def test_fp_members_name_what_redis_holds(store):
    fps = random_fps(20)
    store.fp_add(FINISH_URL, fps)
    stored = {(b, m) for b, m in store.fp_members(fps)
              if m in store.redis.smembers(f"{store.key(FINISH_URL)}:{b}")}
    assert len(stored) == 20


def test_a_store_records_its_buckets_and_every_process_reads_them_from_it(redis_url, prefix):
    """A new store starts with few buckets (each key costs its bytes however little it
    holds); a store written before the record keeps its old 1,024; a second process on a
    store reads the layout the first recorded, whatever it was configured with."""
    from dedupnet.adapters.storage.store import LEGACY_BUCKET_BITS, NEW_STORE_BUCKET_BITS

    fps = random_fps(300)
    new = Store(redis_url, f"{prefix}:new")
    old = Store(redis_url, f"{prefix}:old", bucket_bits=LEGACY_BUCKET_BITS)
    try:
        assert new.bucket_bits == NEW_STORE_BUCKET_BITS < LEGACY_BUCKET_BITS
        assert new.fp_add(FINISH_URL, fps) == 300
        other = Store(redis_url, f"{prefix}:new", bucket_bits=12)  # configured otherwise: the store wins
        assert other.bucket_bits == NEW_STORE_BUCKET_BITS and other.fp_contains(FINISH_URL, fps).all()
        other.close()

        old.fp_add(FINISH_URL, fps)
        old.redis.delete(old.key("fp_bucket_bits"))  # as a store written before the record
        upgraded = Store(redis_url, f"{prefix}:old")
        assert upgraded.bucket_bits == LEGACY_BUCKET_BITS and upgraded.fp_contains(FINISH_URL, fps).all()
        upgraded.close()
    finally:
        for s in (new, old):
            s.delete_prefix()
            s.close()


@pytest.mark.parametrize("n", [1, 2, 17, 64, 65, 300])
def test_a_few_fingerprints_are_laid_out_as_many_are(n):
    """The plain-Python layout of a few fingerprints' commands gives the bytes, order
    and counts of numpy's, extremes of the range included."""
    rng = np.random.default_rng(n)
    fps = np.r_[np.array([0, 2**64 - 1], dtype=np.uint64), rng.integers(0, 2**64 - 1, n, dtype=np.uint64)][:n]
    for bits in (MIN_BUCKET_BITS, 12, MAX_BUCKET_BITS):
        few, many = Batch(bits), Batch(bits)
        few.add(b"PING")
        many.add(b"PING")
        a = few._few_bucket_commands(b"SMISMEMBER", "p:finish_URL", fps)
        b = many._many_bucket_commands(b"SMISMEMBER", "p:finish_URL", fps)
        assert few.payload() == many.payload() and len(few) == len(many)
        assert (a.first, a.size, a.order.tolist(), a.counts.tolist()) == (b.first, b.size, b.order.tolist(), b.counts.tolist())
