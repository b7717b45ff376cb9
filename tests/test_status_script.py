"""The status page's own script (dedupnet/adapters/monitor/status.html) run in Node against a
small stand-in for the DOM: what it draws from a ``status.json`` body, where no browser
is at hand (tests/test_status_page.py drives a real one when there is). Skipped, with
the reason, without Node."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parent.parent / "dedupnet" / "adapters" / "monitor" / "status.html"
NODE = shutil.which("node") or shutil.which("nodejs")

#: Just what the page's script uses of the DOM; the drawn tree is printed as markup.
DOM = r"""
class Node {
  constructor(tag, text) { this.tag = tag; this.attrs = {}; this.children = []; this.text = text; this.dataset = {}; }
  set className(v) { this.attrs["class"] = v; }
  setAttribute(k, v) { this.attrs[k] = String(v); }
  append(...cs) { for (const c of cs) this.children.push(c instanceof Node ? c : new Node(null, String(c))); }
  replaceChildren(...cs) { this.children = []; this.append(...cs); }
  set textContent(v) { this.children = [new Node(null, String(v))]; }
  get textContent() { return this.text !== undefined ? this.text : this.children.map((c) => c.textContent).join(""); }
  html() {
    if (this.tag === null) return this.text.replace(/&/g, "&amp;").replace(/</g, "&lt;");
    const a = Object.entries(this.attrs).map(([k, v]) => ` ${k}="${v.replace(/"/g, "&quot;")}"`).join("");
    return `<${this.tag}${a}>${this.children.map((c) => c.html()).join("")}</${this.tag}>`;
  }
}
const ids = {};
const document = {
  title: "", body: new Node("body"),
  createElement: (t) => new Node(t), createElementNS: (ns, t) => new Node(t),
  createTextNode: (t) => new Node(null, t),
  getElementById: (id) => ids[id] || (ids[id] = new Node("div")),
};
let fetched = 0;
const fetch = async () => { fetched++; return {ok: true, json: async () => BODY}; };
const setTimeout = () => {};
"""


def draw(body: dict) -> str:
    """The page's root after one poll of ``body``, as markup."""
    script = re.search(r"<script>\n(.*?)</script>", PAGE.read_text(), re.S)[1]
    program = (f"const BODY = {json.dumps(body)};\n{DOM}\n{script}\n"
               "Promise.resolve().then(() => new Promise((r) => setImmediate(r))).then(() => "
               "{ if (document.body.dataset.state !== 'ok') throw new Error('not drawn'); "
               "process.stdout.write(document.getElementById('root').html()); });")
    done = subprocess.run([NODE, "-e", program], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def center_body(**more) -> dict:
    return {"role": "center", "network": 1, "listen": "127.0.1.1:7700", "mode": "exact", "time": 1.0,
            "poll_interval": 2, "admitted": {"total": 900, "per_s": 12.5, "window": 10},
            "history": {"step": 10, "admitted_per_s": [0, 40.0, 12.5], "pages_per_s": [0, 0, 0]},
            "liveness": [
                {"member": "127.0.1.10", "kind": "host", "address": None, "state": "live", "silent": 0.4,
                 "waiting_sets": 0, "task_urls": 3, "task_pool": 610, "task_pool_age": 8.0},
                {"member": "127.0.1.11", "kind": "host", "address": None, "state": "live", "silent": 0.2,
                 "waiting_sets": 0, "task_urls": 0, "task_pool": 44, "task_pool_age": 1.5}],
            "crawl": {"verdict": "in progress", "reasons": [], "hosts": [
                {"ip": "127.0.1.10", "task_pool": 505, "task_pool_from": "host"},
                {"ip": "127.0.1.11", "task_pool": 44, "task_pool_from": "heartbeat", "task_pool_age": 1.5}]},
            **more}


def cell(dom: str, member: str, name: str) -> str:
    row = re.search(rf'<tr data-member="{re.escape(member)}".*?</tr>', dom, re.S)[0]
    return re.search(rf'data-field="{name}">([^<]*)<', row)[1]


pytestmark = pytest.mark.skipif(NODE is None, reason="no node on PATH to run the page's script")


def test_a_hosts_task_pool_is_one_figure_with_its_age():
    """Its center just asked the host (the crawl's look): that figure, and no other; a
    host not asked shows its heartbeat's, with how old it is."""
    dom = draw(center_body())
    assert cell(dom, "127.0.1.10", "task-pool") == "505 (now)"
    assert "610" not in dom
    assert cell(dom, "127.0.1.11", "task-pool") == "44 (1.5 s ago)"


def test_a_center_charts_its_admitted_urls_a_second():
    dom = draw(center_body())
    chart = re.search(r'<svg [^>]*data-field="chart-admitted"[^>]*>.*?</svg>', dom, re.S)[0]
    assert 'data-points="3"' in chart and "<polyline" in chart
    points = re.search(r' points="([^"]*)"', chart)[1].split()
    heights = [float(p.split(",")[1]) for p in points]
    assert heights[1] == min(heights)  # the highest rate is the highest point
    assert "now 12.5, at most 40 — the last 1 min" in dom
    assert "chart-pages" not in dom


def test_a_host_shows_its_pages_a_second_and_their_chart():
    body = {"role": "host", "network": 1, "ip": "127.0.1.10", "mode": "exact", "time": 1.0, "poll_interval": 2,
            "connected": True, "center": "127.0.1.1:7700", "sets_in_flight": {"unacked": 0},
            "crawler": {"pages_done": 420}, "pages": {"total": 420, "per_s": 31.4, "window": 10},
            "history": {"step": 10, "admitted_per_s": [], "pages_per_s": [20.0, 31.4]},
            "admitted": {"total": 0, "per_s": 0, "window": 10}}
    dom = draw(body)
    assert re.search(r'data-field="pages-per-s">31.4<', dom)
    assert 'data-field="chart-pages"' in dom and 'data-points="2"' in dom


def test_no_history_yet_is_said_not_drawn():
    dom = draw(center_body(history={"step": 10, "admitted_per_s": [], "pages_per_s": []}))
    assert "no figures yet" in dom and "<polyline" not in dom


def test_the_history_is_one_rate_per_step_over_the_last_minutes(monkeypatch):
    """What the charts draw, from the daemon: a point every HISTORY_STEP seconds, a rate
    per step, the latest one since the last step; no more than HISTORY_SPAN of them."""
    from dedupnet.adapters.monitor import status_page
    from dedupnet.adapters.monitor.metrics import Counters

    clock = [1000.0]
    monkeypatch.setattr(status_page.time, "monotonic", lambda: clock[0])

    async def status():
        return {}

    counters = Counters()
    view = status_page.StatusView(status, counters, errors=False)
    for second in range(1, 26):
        clock[0] += 1
        counters.inc("urls_admitted", 10 if second <= 10 else 20)
        counters.inc("pages_done", 5)
        view.sample()
    history = view.history()
    assert history == {"step": 10.0, "admitted_per_s": [10.0, 20.0, 20.0], "pages_per_s": [5.0, 5.0, 5.0]}
    assert view.pages()["per_s"] == 5.0
    for _ in range(int(status_page.HISTORY_SPAN) * 2):
        clock[0] += 1
        view.sample()
    assert len(view.history()["admitted_per_s"]) == status_page.HISTORY_SPAN / status_page.HISTORY_STEP
