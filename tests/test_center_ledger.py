"""The center's ledger in blocks (center_host/ledger.py): every URL given to a host stays
on it, exactly once, until it is taken off, whatever the blocks are re-deflated into;
what is stored (in Redis, or as the models keep it) loads back to the same ledger; and
the text kept stays within about twice what is on it."""

import random

import pytest

from center_host.events import Unledger
from center_host.ledger import MAX_BLOCK, SLACK, SMALL_RUN, HostLedger, Ledgers, deflate, inflate, on_ledger
from center_host.pools import LEDGER_BLOCKS, LEDGER_HOSTS, LEDGER_LIVE, LEGACY_LEDGER, LEGACY_LEDGER_FP, CenterPools
from dedupnet.codec.urls import fingerprint_many
from dedupnet.harness.dst.store import CenterStore, Journal, stored_ledger

HOST = "127.0.1.10"


def urls_of(rnd: random.Random, n: int) -> list[str]:
    return [f"http://site{rnd.randrange(300)}.example/d{rnd.randrange(9)}/p{rnd.randrange(10**9)}" for _ in range(n)]


class Replay(CenterStore):
    """What the actions leave stored (the deterministic simulator's model of a center's
    Redis, as center_host/pools.py writes it)."""

    def __init__(self) -> None:
        super().__init__(Journal(lambda: 0.0, 0.0, enabled=False))

    def stored(self) -> dict:
        return stored_ledger(self.ledger_blocks, self.ledger_live)

    def on_ledger(self) -> list[str]:
        """Every URL a stored block has on the ledger (one in two blocks, twice)."""
        return [u for data, bits in self.stored().get(HOST, {}).values() for u in on_ledger(data, bits)]


def test_random_gives_and_takes_keep_the_ledger_exact_and_its_text_bounded():
    rnd = random.Random(7)
    ledgers, stored, truth = Ledgers(), Replay(), set()
    compactions = 0
    for step in range(600):
        if rnd.random() < 0.55 or not truth:
            urls = urls_of(rnd, rnd.choice((1, 2, 5, 40, 300)))
            urls += rnd.sample(sorted(truth), min(len(truth), rnd.randrange(3)))  # some already on it
            actions = ledgers.give(HOST, urls)
            truth.update(urls)
        else:
            urls = rnd.sample(sorted(truth), min(len(truth), rnd.choice((1, 3, 20, 120))))
            urls += urls_of(rnd, 2)  # never given: changes nothing
            actions = ledgers.take(HOST, urls)
            truth.difference_update(urls)
            gone = [u for a in actions if isinstance(a, Unledger) for u in a.urls]
            assert len(gone) == len(set(gone)) and set(gone) <= set(urls)
        compactions += sum(1 for a in actions if isinstance(a, Unledger) and not a.urls and a.drop)
        stored.apply(actions)
        held = ledgers.get(HOST)
        assert len(held or ()) == len(truth)
        if held:
            assert held.kept <= 2 * len(held) + SLACK + 300 and held.small < SMALL_RUN
        if step % 100 == 0:
            assert sorted(held or ()) == sorted(truth)
            assert sorted(stored.on_ledger()) == sorted(truth)  # each URL in exactly one stored block
    assert compactions >= 3


def test_a_restored_ledger_is_the_stored_one_and_new_blocks_take_new_ids():
    rnd = random.Random(3)
    ledgers, stored = Ledgers(), Replay()
    for _ in range(60):
        stored.apply(ledgers.give(HOST, urls_of(rnd, 30)))
    taken = rnd.sample(sorted(ledgers[HOST]), 700)
    stored.apply(ledgers.take(HOST, taken))
    again = Ledgers()
    again.restore(stored.stored())
    assert sorted(again[HOST]) == sorted(ledgers[HOST]) and len(again[HOST]) == len(ledgers[HOST])
    actions = again.give(HOST, ["http://new.example/1"])
    assert actions[0].block > max(stored.ledger_blocks[HOST])
    stored.apply(actions)
    rest = rnd.sample(sorted(again[HOST]), 300)  # bits of the restored blocks cleared as before the restart
    stored.apply(again.take(HOST, rest))
    assert sorted(stored.on_ledger()) == sorted(again[HOST]) and not set(rest) & set(again[HOST])


def test_a_large_assignment_deflates_to_a_fraction_of_its_text():
    urls = urls_of(random.Random(1), 2000)
    held = HostLedger(HOST)
    (put,) = held.give(urls, iter(range(1, 10)))
    assert inflate(put.data) == sorted(urls)
    assert len(put.data) < 0.5 * sum(map(len, urls))


def test_the_stored_ledger_loads_back_from_redis_and_a_text_ledger_of_an_earlier_version_is_turned_into_blocks(store):
    pools = CenterPools(store)
    rnd = random.Random(5)
    ledgers = Ledgers()
    for _ in range(20):
        pools.apply(ledgers.give(HOST, urls_of(rnd, 25)))
    pools.apply(ledgers.take(HOST, rnd.sample(sorted(ledgers[HOST]), 200)))
    assert pools.ledger() == {HOST: sorted(ledgers[HOST])}
    again = Ledgers()
    again.restore(pools.load().ledger)
    assert sorted(again[HOST]) == sorted(ledgers[HOST])

    old = "127.0.1.11"
    legacy = urls_of(rnd, 50)
    store.command(b"SADD", store.key(f"{LEGACY_LEDGER}:{old}"), *legacy)
    store.command(b"SADD", store.key(LEDGER_HOSTS), old)
    assert pools.ledger() == {HOST: sorted(ledgers[HOST]), old: sorted(legacy)}
    assert not store.command(b"EXISTS", store.key(f"{LEGACY_LEDGER}:{old}"))
    assert pools.ledger()[old] == sorted(legacy)  # loaded again: the same, from its blocks


@pytest.mark.parametrize("n", [1, 4999])
def test_taking_everything_leaves_no_block_behind(n):
    held = Ledgers()
    stored = Replay()
    urls = urls_of(random.Random(n), n)
    stored.apply(held.give(HOST, urls))
    stored.apply(held.take(HOST, urls))
    assert HOST not in held and not stored.ledger_blocks[HOST] and not stored.ledger_live.get(HOST)


def test_blocks_mostly_taken_are_re_deflated_together():
    rnd = random.Random(11)
    held, stored = Ledgers(), Replay()
    given = [urls_of(rnd, 100) for _ in range(100)]
    for urls in given:
        stored.apply(held.give(HOST, urls))
    assert held[HOST].kept == 10_000
    for urls in given:
        stored.apply(held.take(HOST, urls[:85]))
    assert len(held[HOST]) == 1500 and held[HOST].kept <= 2 * 1500 + SLACK
    assert len(stored.ledger_blocks[HOST]) < 100 and sorted(held[HOST]) == sorted(u for urls in given for u in urls[85:])
    assert sorted(stored.on_ledger()) == sorted(held[HOST])


def test_a_ledger_kept_with_fingerprints_by_an_earlier_version_loads_as_bits_and_its_fingerprints_go(store):
    pools = CenterPools(store)
    rnd = random.Random(9)
    blocks = [sorted(urls_of(rnd, n)) for n in (5, 300, 40)]
    live = [blocks[0][:2], blocks[1][::3], []]  # the last block's URLs were all reported
    for block, urls in enumerate(blocks, start=1):
        store.command(b"HSET", store.key(f"{LEDGER_BLOCKS}:{HOST}"), block, deflate(urls))
    store.fp_add(f"{LEGACY_LEDGER_FP}:{HOST}", fingerprint_many([u for urls in live for u in urls]))
    store.command(b"SADD", store.key(LEDGER_HOSTS), HOST)
    expected = sorted(u for urls in live for u in urls)
    assert pools.ledger() == {HOST: expected}
    assert store.fp_count(f"{LEGACY_LEDGER_FP}:{HOST}") == 0
    assert sorted(int(b) for b in store.command(b"HKEYS", store.key(f"{LEDGER_BLOCKS}:{HOST}"))) == [1, 2]
    assert len(store.command(b"HGET", store.key(f"{LEDGER_LIVE}:{HOST}"), 2)) == 300 // 8 + 1
    again = Ledgers()
    again.restore(pools.load().ledger)
    assert sorted(again[HOST]) == expected == pools.ledger()[HOST]  # and loaded again: the same
    pools.apply(again.take(HOST, blocks[1][::3]))
    assert pools.ledger() == {HOST: sorted(blocks[0][:2])}


def test_a_report_rewrites_at_most_an_eighth_of_a_url_a_block_it_touches():
    held = Ledgers()
    urls = urls_of(random.Random(2), MAX_BLOCK)
    held.give(HOST, urls)
    (off,) = held.take(HOST, urls[:3])
    assert isinstance(off, Unledger) and len(off.bits) == 1 and len(off.bits[0][1]) == MAX_BLOCK // 8
