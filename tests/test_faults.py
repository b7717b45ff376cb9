"""Faults as scenarios: the vocabulary (dedupnet/harness/faults.py), the harness's own
invariant check (dedupnet.harness.crawlchecks.check_extracted), and every process fault on real daemon
processes (dedupnet/harness/simproc.py, dedupnet/harness/procfaults.py): 0 duplicates, 0 lost, quiescent."""

import io
import subprocess
import sys
import time

import pytest
from redis.exceptions import BusyLoadingError, ResponseError

from dedupnet.harness.faults import (FAULTS, LINK_FAULTS, PROCESS_FAULTS, Fault, chaos_schedule, format_fault,
                             parse_fault, resolve)
from dedupnet.harness.crawlchecks import check_extracted
from dedupnet.harness.report import SimConfig
from dedupnet.harness.powercut import unavailable
from dedupnet.harness.simproc import SUPPORTED_FAULTS, check_faults, simulate_processes
from dedupnet.adapters.storage.store import raise_if_refused
from dedupnet.harness.web import SyntheticWeb, WebSpec


# -- the vocabulary ------------------------------------------------------------------------
def test_parse_fault_reads_kind_and_keys():
    assert parse_fault("kill-host") == Fault("kill-host")
    assert parse_fault("kill-host:at=0.3,for=5,target=host:1.2") == Fault("kill-host", 0.3, 5.0, "host:1.2")
    assert parse_fault(" freeze-center:for=8 ") == Fault("freeze-center", duration=8.0)
    assert parse_fault("kill-redis:target=redis:all") == Fault("kill-redis", target="redis:all")
    assert parse_fault("partition:target=wan:1-2,for=20") == Fault("partition", duration=20.0, target="wan:1-2")
    for f in (Fault("kill-center", 0.25, 1.5, "center:3"), Fault("leave-host"), Fault("lossy-wan", target="wan:2-3")):
        assert parse_fault(format_fault(f)) == f
    assert set(FAULTS) == set(PROCESS_FAULTS) | set(LINK_FAULTS)


@pytest.mark.parametrize("spec, message", [
    ("explode-host", "unknown fault 'explode-host'"),
    ("kill-host:when=0.3", "unknown key 'when'"),
    ("kill-host:at", "is not key=value"),
    ("kill-host:at=soon", "at='soon' is not a number"),
    ("kill-host:at=1.5", "not a fraction of the pages in 0..1"),
    ("kill-host:for=-1", "negative"),
    ("kill-host:at=0.1,at=0.2", "at given twice"),
    ("kill-host:target=center:1", "its target is host:<network>.<index>"),
    ("kill-center:target=host:1.0", "its target is center:<network>"),
    ("partition:target=wan:1-1", "two different networks"),
    ("kill-host:target=somewhere", "bad fault target 'somewhere'"),
])
def test_parse_fault_says_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_fault(spec)


def test_resolve_fills_every_field_from_the_seed_alone():
    f = resolve(Fault("kill-host"), seed=7, networks=3, hosts=3)
    assert f == resolve(Fault("kill-host"), seed=7, networks=3, hosts=3)
    assert 0.1 <= f.at <= 0.7 and f.duration == 3.0 and f.target.startswith("host:")
    assert resolve(Fault("kill-redis"), 1, 2, 2).target == "redis"
    given = Fault("freeze-center", 0.5, 9.0, "center:2")
    assert resolve(given, 1, 2, 2) == given
    draws = {resolve(Fault("kill-center"), s, 3, 3).target for s in range(20)}
    assert len(draws) > 1  # the seed does choose
    with pytest.raises(ValueError, match="host index 5"):
        resolve(Fault("kill-host", target="host:1.5"), 1, 2, 2)
    with pytest.raises(ValueError, match="no network"):
        resolve(Fault("kill-center", target="center:4"), 1, 2, 2)
    with pytest.raises(ValueError, match="at least 2 hosts"):
        resolve(Fault("leave-host"), 1, 2, 1)


def test_chaos_schedules_are_reproducible_and_draw_only_the_kinds_given():
    a = chaos_schedule(5, 3, 3, 8, kinds=PROCESS_FAULTS)
    assert a == chaos_schedule(5, 3, 3, 8, kinds=PROCESS_FAULTS)
    assert a[:3] == chaos_schedule(5, 3, 3, 3, kinds=PROCESS_FAULTS)  # schedule i depends on (seed, i) only
    assert a != chaos_schedule(6, 3, 3, 8, kinds=PROCESS_FAULTS)
    for schedule in a:
        assert 1 <= len(schedule) <= 2 and [f.at for f in schedule] == sorted(f.at for f in schedule)
        for f in schedule:
            assert f.kind in PROCESS_FAULTS and f.at is not None and f.target is not None
            assert parse_fault(format_fault(f)) == f  # a chaos line reproduces as --fault specs
    assert all(f.kind != "leave-host" for s in chaos_schedule(1, 2, 1, 30, kinds=PROCESS_FAULTS) for f in s)
    with pytest.raises(ValueError, match="unknown fault kinds"):
        chaos_schedule(1, 2, 2, 1, kinds=("nope",))


def test_the_process_runner_refuses_what_it_cannot_run_before_starting():
    check_faults(SimConfig(networks=2, hosts=2, faults=(Fault("partition"), Fault("lossy-lan"))))  # link faults run
    with pytest.raises(ValueError, match="needs at least two networks"):
        check_faults(SimConfig(networks=1, hosts=2, faults=(Fault("partition"),)))
    with pytest.raises(ValueError, match="is not a link of 2 networks"):
        check_faults(SimConfig(networks=2, hosts=2, faults=(Fault("partition", target="wan:1-3"),)))
    with pytest.raises(ValueError, match="nobody would be left"):
        check_faults(SimConfig(networks=2, hosts=2, faults=(Fault("leave-host", target="host:1.0"),
                                                            Fault("leave-host", target="host:1.1"))))
    with pytest.raises(ValueError, match="host index 3"):
        check_faults(SimConfig(networks=2, hosts=2, faults=(Fault("kill-host", target="host:1.3"),)))


def test_cli_rejects_a_bad_fault_spec_with_its_reason():
    out = subprocess.run([sys.executable, "-m", "dedupnet.cli", "sim", "--fault", "kill-host:at=2"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "not a fraction of the pages" in out.stderr
    out = subprocess.run([sys.executable, "-m", "dedupnet.cli", "sim", "--fault", "kill-host"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "need --processes" in out.stderr


# -- a restarted Redis answers LOADING: "not yet", not data ----------------------------------
def test_loading_replies_are_a_transient_error_not_results():
    results = [1, ResponseError("WRONGTYPE x")]  # an error of one command is that command's answer
    assert raise_if_refused(results) is results
    with pytest.raises(BusyLoadingError):
        raise_if_refused([ResponseError("LOADING Redis is loading the dataset in memory"), 1])


# -- the fault runner on real processes, virtual time ------------------------------------------
class _Proc:
    """What FaultRunner needs of simproc.Daemon, around a real child process."""

    def __init__(self, name):
        self.name, self.down, self.gone, self.lives = name, False, False, 0
        self.carried = 0
        self.proc = None
        self.spawn()

    def spawn(self):
        self.proc = subprocess.Popen(["sleep", "60"])
        self.lives += 1

    def new_life(self):
        self.carried += 1

    def cpu_used(self):
        return 0.0

    async def poll_status(self):
        return {}

    def state(self):
        with open(f"/proc/{self.proc.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    def state_once_in(self, wanted: tuple[str, ...]) -> str:
        """The process's state once it is one of ``wanted``: the kernel shows a signal's
        effect once the process has taken it, a moment of real time after it was sent
        (virtual time jumps), longer on a loaded machine. Waits in real time, for up to
        a bound no scheduler stall reaches, and returns whatever state it ends in."""
        deadline = time.monotonic() + 60.0
        while self.state() not in wanted and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.state()


async def test_fault_runner_kills_freezes_and_serialises_faults_on_one_target(autojump_clock):
    import trio

    from dedupnet.harness.procfaults import FaultRunner

    host, center = _Proc("127.0.1.10"), _Proc("center1")
    restarts, states = [], []

    async def restart(d):
        restarts.append((d.name, trio.current_time()))
        d.spawn()

    faults = [Fault("kill-host", 0.1, 5.0, "host:1.0"), Fault("kill-host", 0.2, 5.0, "host:1.0"),
              Fault("freeze-center", 0.3, 8.0, "center:1")]
    runner = FaultRunner(faults, {"host:1.0": host, "center:1": center}, restart, None, 0.0)
    try:
        async with trio.open_nursery() as nursery:
            runner.start_due(nursery, fetched=5, total=100)
            assert runner.busy is False  # nothing due yet
            runner.start_due(nursery, fetched=40, total=100)  # all three are due now
            assert runner.busy and runner.active == 3
            await trio.sleep(1)
            states.append(center.state_once_in(("T",)))  # frozen: stopped
            with trio.fail_after(10**6):  # virtual seconds; the waits for killed processes are real
                while runner.busy:
                    await trio.sleep(1)
        assert states == ["T"] and center.state_once_in(("S", "R")) in ("S", "R")  # continued
        # The second kill of the same host waited for the first one's restart.
        assert [n for n, _ in restarts] == ["127.0.1.10", "127.0.1.10"] and host.lives == 3
        assert restarts[1][1] - restarts[0][1] >= 5.0
        assert [r.note.split(",")[0].split(" ")[-1] for r in runner.records[:2]] == ["killed"] * 2
        assert runner.killed_hosts() == frozenset({"127.0.1.10"})
        runner.not_started()
        assert all(r.started is not None and r.ended >= r.started for r in runner.records)
    finally:
        for d in (host, center):
            d.proc.kill()
            d.proc.wait()


# -- the harness's own invariant -------------------------------------------------------------
@pytest.fixture(scope="module")
def crawled():
    """A web, its seeds, and a perfect crawl of it written into the web's counts."""
    web = SyntheticWeb(WebSpec(pages=300, sites=6, seed=3), port=8077)
    seeds = web.seeds(4)
    reach = web.reachable_detail(seeds)
    return web, seeds, reach


def _crawl(web, reach, by="127.0.1.10"):
    web.reset_counts()
    for u in reach.fetched:
        web.answer_counts[u] += 1
        web.answered_by[u].append(by)


def test_invariant_holds_for_a_perfect_crawl_and_names_each_violation(crawled):
    web, seeds, reach = crawled
    _crawl(web, reach)
    assert check_extracted(web, seeds, reach.depth) == ([], 0)

    page = sorted(reach.pages)[5]
    lost = sorted(reach.pages)[7]
    web.answer_counts[page] += 1
    web.answered_by[page].append("127.0.2.10")  # another host fetched it too
    del web.answer_counts[lost]
    forbidden = next(iter(reach.disallowed))
    web.fetch_counts[forbidden] += 1
    violations, excused = check_extracted(web, seeds, reach.depth)
    text = "\n".join(violations)
    assert excused == 0
    assert f"{page}: crawled 2 times (duplicate)" in text and "by 127.0.1.10, 127.0.2.10" in text
    assert f"{lost}: extracted, never crawled (lost); carried by" in text
    assert f"{forbidden}: robots.txt forbids it, fetched 1 time(s)" in text


def test_a_killed_host_fetching_its_own_page_again_is_excused_nobody_else(crawled):
    web, seeds, reach = crawled
    _crawl(web, reach)
    page = sorted(reach.pages)[3]
    web.answer_counts[page] += 1
    web.answered_by[page].append("127.0.1.10")
    assert check_extracted(web, seeds, reach.depth, killed=frozenset({"127.0.1.10"})) == ([], 1)
    violations, excused = check_extracted(web, seeds, reach.depth, killed=frozenset({"127.0.1.11"}))
    assert excused == 0 and len(violations) == 1 and "crawled 2 times" in violations[0]


# -- process faults on real daemons -----------------------------------------------------------
#: Small enough for CI: 2 x 2, a few hundred pages; each fault early enough that the crawl
#: is still running when it strikes, short enough for the file to stay near two minutes.
SMALL = dict(networks=2, hosts=2, pages=500, sites=8, timeout=90, seed=2)


async def _run_fault(redis_url, *specs, **more):
    out = io.StringIO()
    cfg = SimConfig(**SMALL, **more, faults=tuple(parse_fault(s) for s in specs))
    report = await simulate_processes(cfg, redis_url, out=out)
    return report, out.getvalue()


def _assert_clean(report, log):
    assert not report.timed_out, log
    assert report.lost_urls == 0, (report.lost_examples, log)
    assert report.invariant_violations == 0, report.invariant_examples
    assert report.duplicate_fetches == report.refetched_after_kill, report.invariant_examples
    assert report.fetched_urls == report.reachable_urls
    assert all(f["started"] is not None and f["ended"] >= f["started"] for f in report.faults), report.faults


@pytest.mark.parametrize("spec", [
    "kill-host:at=0.2,for=1,target=host:1.1",
    "kill-center:at=0.2,for=1,target=center:1",
    "kill-redis:at=0.2,for=1",
    "freeze-host:at=0.2,for=2,target=host:2.0",
    "freeze-center:at=0.2,for=6,target=center:2",  # longer than the 5 s heartbeat timeout
    "leave-host:at=0.2,target=host:2.1",
])
async def test_a_process_fault_loses_nothing_and_fetches_nothing_twice(redis_url, spec):
    report, log = await _run_fault(redis_url, spec)
    _assert_clean(report, log)
    (fault,) = report.faults
    kind = spec.split(":")[0]
    assert f"fault {fault['spec']} started" in log
    if kind in ("kill-host", "kill-center"):
        assert "killed, restarted as pid" in fault["note"]
    if kind == "leave-host":
        assert fault["note"] == "left for good (exit code 0)"
        assert "127.0.2.11" in report.per_host_pages
    if kind == "kill-redis":
        assert "restarted on its AOF" in fault["note"]


async def test_a_host_frozen_past_the_heartbeat_timeout_fetches_nothing_twice(redis_url):
    """The center gives up on the host after 5 s; the tasks it sent it meanwhile are in the
    host's socket, read when it thaws. They used to be given to another host as well (80
    URLs fetched twice at 2x2, 600 pages); now they wait for it (center_host/protocol.py)."""
    report, log = await _run_fault(redis_url, "freeze-host:at=0.2,for=7,target=host:1.1")
    _assert_clean(report, log)


async def test_a_host_whose_own_redis_is_killed_restarts_it_and_the_crawl_completes(redis_url):
    """kill -9 of the embedded Redis a host started itself, mid-crawl: the host daemon
    starts it again on its data dir and carries on, with no operator action; nothing is
    lost, and the host fetches again at most the pages it had in flight (its crawl
    concurrency)."""
    report, log = await _run_fault(redis_url, "kill-host-redis:at=0.3,target=host:1.0")
    _assert_clean(report, log)
    (fault,) = report.faults
    assert "the host restarted it as pid" in fault["note"], (fault, log)
    assert report.duplicate_fetches <= SimConfig().concurrency, report.invariant_examples


async def test_a_host_gone_for_good_with_its_disk_loses_nothing_and_no_operator_acts(redis_url):
    """SIGKILL and its Redis data deleted, never started again: its center re-issues what
    it held once it has been silent for reissue_after, and the crawl completes. What is
    fetched twice is what the host had in flight or had finished without its center
    knowing (counted from its store as it died); the run is not quiescent meanwhile (the
    center's ledger holds the gone host's tasks)."""
    report, log = await _run_fault(redis_url, "host-gone-disk-lost:at=0.3,target=host:1.1",
                                   settings={"reissue_after": 6.0})
    _assert_clean(report, log)
    (fault,) = report.faults
    assert "its data deleted" in fault["note"], (fault, log)
    assert fault["in_flight"] is not None, (fault, log)
    assert report.duplicate_fetches <= fault["in_flight"], (fault, log)
    assert report.per_host_pages.get("127.0.1.11", 0) < sum(report.per_host_pages.values()) / 2


#: The power-cut scenario's runs: (web and fault seed, share of the URLs fetched at the cut).
#: Two here, early and half way; bench/bench_powercut.py runs as many as asked.
POWER_CUTS = [(1, 0.2), (4, 0.5)]


@pytest.mark.parametrize("seed, at", POWER_CUTS, ids=[f"seed{s}-at{a:g}" for s, a in POWER_CUTS])
async def test_a_power_cut_of_every_machine_loses_nothing_and_the_crawl_completes_by_itself(redis_url, seed, at):
    """Every daemon's Redis on its own loop-mounted ext4; at the cut each filesystem is shut
    down without flushing its journal (as a machine that lost power), every process is
    SIGKILLed, and everything is started again on what the disks kept, as a machine's boot
    would: no repair in between. Durable acks: no acknowledged write is lost, so nothing
    is lost, every daemon comes up on its damaged AOF by itself, the crawl completes, and
    only pages in flight at the cut are fetched again (by the host that had them)."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    cfg = SimConfig(**{**SMALL, "seed": seed}, durable_acks=True, faults=(parse_fault(f"power-cut:at={at},for=1"),))
    out = io.StringIO()
    report = await simulate_processes(cfg, redis_url, out=out)
    log = out.getvalue()
    _assert_clean(report, log)
    (fault,) = report.faults
    assert "filesystems shut down without their journal's tail" in fault["note"], (fault, log)
    assert fault["note"].endswith("all restarted"), (fault, log)  # each came up on its disk with no hand repair
    assert fault["in_flight"] is not None, (fault, log)
    assert report.duplicate_fetches <= fault["in_flight"], (fault, report.invariant_examples, log)


async def test_a_wan_partition_between_center_processes_loses_nothing(redis_url):
    """A link fault with --processes: the WAN link 1-2 goes through a relay in the
    harness (center 1's --peer points at it; it connects on from 127.0.1.1, so center 2
    accepts it), cut silently for 4 s while the crawl runs, then healed."""
    report, log = await _run_fault(redis_url, "partition:at=0.2,for=4,target=wan:1-2")
    _assert_clean(report, log)
    assert report.duplicate_fetches == 0
    (fault,) = report.faults
    assert fault["kind"] == "partition" and fault["target"] == "wan:1-2"
    assert 3.5 <= fault["ended"] - fault["started"] <= 6, fault
    (relay,) = report.links["relays"].values()
    assert relay["accepted"] >= 1 and relay["messages"] > 0, report.links  # the centers did talk through it
    assert [e["event"] for e in report.links["events"]] == ["start", "end"]
    assert report.per_network_admitted["net:1"] > 0 and report.per_network_admitted["net:2"] > 0


def test_cli_chaos_runs_reproducible_schedules_and_sums_them_up(tmp_path):
    args = [sys.executable, "-m", "dedupnet.cli", "sim", "--processes", "--networks", "2", "--hosts", "2",
            "--pages", "300", "--sites", "6", "--timeout", "90", "--chaos", "2", "--chaos-seed", "11"]
    out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    lines = out.stdout.splitlines()
    assert "chaos seed 11" in lines[0], out.stdout + out.stderr
    runs = [line for line in lines if line.startswith(("ok", "FAIL"))]
    assert len(runs) == 2, out.stdout + out.stderr
    expected = [" ".join(format_fault(f) for f in s) for s in chaos_schedule(11, 2, 2, 2, kinds=SUPPORTED_FAULTS)]
    assert [line.split("   ")[-1].strip() for line in runs] == expected  # the printed specs are the schedule
    summary = lines[-1] if not any("reproduce" in line for line in lines) else [
        line for line in lines if line.startswith("-- chaos seed")][0]
    assert "schedules passed" in summary and "duplicates" in summary and "wall" in summary
    assert out.returncode == (0 if all(line.startswith("ok") for line in runs) else 1), out.stdout + out.stderr
