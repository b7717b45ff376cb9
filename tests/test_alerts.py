"""The shipped monitoring (deploy/prometheus/, deploy/grafana/) checked with the real
Prometheus tools from Debian's ``prometheus`` package: ``promtool check config`` (and
the rules it loads), ``promtool test rules`` (tests/prometheus/alerts_test.yml: each
alert fires where it should and only there), and ``promtool check metrics`` on what a
live center and host serve (real daemons, real Redis, real HTTP on loopback).

promtool is installed by ``make promtool`` (``make test`` runs it; as root with apt-get
it installs the package). Without it, this module tries that target once and is skipped
with the reason only when promtool is still missing."""

import json
import pathlib
import random
import re
import shutil
import subprocess

import httpx
import pytest
import trio
import yaml

from dedupnet.adapters.monitor.metric_catalog import METRICS
from dedupnet.harness.cluster import open_cluster

ROOT = pathlib.Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
RULE_TESTS = ROOT / "tests" / "prometheus" / "alerts_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dedupnet.json"
EXPOSED = {m.exposed: m for m in METRICS.values()}


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None and shutil.which("make"):
        subprocess.run(["make", "-s", "-C", str(ROOT), "promtool"], capture_output=True, timeout=960)
        path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not found and `make promtool` could not install it (it needs root and apt-get: "
                    "Debian's prometheus package)")
    return path


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=60)


def test_config_and_rules_pass_promtool_check(promtool):
    done = run(promtool, "check", "config", str(CONFIG))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout and "rules found" in done.stdout  # the rule file was loaded and checked


def test_alert_rules_pass_their_promtool_tests(promtool):
    done = run(promtool, "test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def alert_names() -> list[str]:
    return [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


def test_every_alert_is_tested_and_uses_declared_metrics():
    """An alert without a test case, or on a metric the daemons do not declare (renamed,
    dropped, misspelt), would never fire: both fail here."""
    tested = {t["alertname"] for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for t in case.get("alert_rule_test", []) if t.get("exp_alerts")}
    names = alert_names()
    assert len(names) >= 8 and set(names) <= tested, f"alerts with no firing test: {set(names) - tested}"
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            for name in set(re.findall(r"\bdedupnet_[a-z0-9_]+", rule["expr"])):
                assert name in EXPOSED, f"{rule['alert']}: {name} is not declared in dedupnet/adapters/monitor/metric_catalog.py"


def test_dashboard_queries_use_declared_metrics():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) > 10
    for expr in exprs:
        names = set(re.findall(r"\bdedupnet_[a-z0-9_]+", expr))
        assert names or "up{" in expr, expr
        assert names <= set(EXPOSED), f"{expr}: {names - set(EXPOSED)} not declared"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for expr in exprs:
        assert set(re.findall(r"\$(\w+)", expr)) - {"__rate_interval"} <= variables, expr


def fetch(port: int) -> str:
    r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert r.status_code == 200
    return r.text


async def test_live_daemons_metrics_pass_promtool_check_metrics(promtool, redis_url):
    """A center and a host that have exchanged sets: what they serve passes promtool's
    linter (HELP, TYPE, counter names, units) and every family is declared."""
    async with open_cluster(redis_url, 2, 1, set_size=100, prefix=f"prom{random.random()}",
                            metrics=("127.0.0.1", 0)) as system:
        h10 = system.hosts["127.0.1.10"]
        await h10.store.run(h10.pools.push, [f"http://site{i}.example/p" for i in range(20)])
        with trio.fail_after(20):
            while system.centers[1].counters.total("urls_admitted") == 0:
                await trio.sleep(0.05)
        for daemon in (system.centers[1], h10):
            text = await trio.to_thread.run_sync(fetch, daemon.http_port)
            done = await trio.to_thread.run_sync(lambda: run(promtool, "check", "metrics", stdin=text))
            assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr
            families = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
            assert families and families <= set(EXPOSED), families - set(EXPOSED)
            assert "dedupnet_store_up" in families and "dedupnet_pool_entries" in families
        assert "dedupnet_crawl_verdict" in await trio.to_thread.run_sync(fetch, system.centers[1].http_port)
