"""The conformance vectors: loading, choosing a mode, and comparing what a runner saw.

Both runners (test_vectors_core.py on the sans-I/O cores, test_vectors_tcp.py on the real
daemons) use only this module to read vectors, so a vector means the same in both. The
format is vector.schema.json; the table from the paper's sentences to the vectors is
README.md.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest

from dedupnet.codec import messages
from dedupnet.codec.messages import Kind, Message

HERE = Path(__file__).parent
VECTOR_DIR = HERE / "vectors"
SCHEMA = json.loads((HERE / "vector.schema.json").read_text())
_validator = jsonschema.Draft7Validator(SCHEMA, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)


@dataclass(frozen=True)
class Vector:
    path: Path
    data: dict

    @property
    def id(self) -> str:
        return self.path.stem

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def has_timer(self) -> bool:
        return any("timer" in step for step in self.data["steps"])


def load(path: Path) -> Vector:
    data = json.loads(path.read_text())
    errors = sorted(_validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        raise ValueError(f"{path.name} does not follow vector.schema.json: "
                         + "; ".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5]))
    return Vector(path, data)


def load_all() -> list[Vector]:
    return [load(p) for p in sorted(VECTOR_DIR.glob("*.json"))]


def cases(skip=None) -> list:
    """pytest params ``(vector, mode)`` for every vector and each of its modes.
    ``skip(vector, mode)`` may return a reason to skip (the TCP runner's)."""
    params = []
    for v in load_all():
        for mode in v["modes"]:
            marks = []
            xfail = v.get("xfail")
            if isinstance(xfail, dict):
                xfail = xfail.get(mode)
            if xfail:
                marks.append(pytest.mark.xfail(reason=xfail, strict=True))
            reason = skip(v, mode) if skip else None
            if reason:
                marks.append(pytest.mark.skip(reason=reason))
            params.append(pytest.param(v, mode, id=f"{v.id}[{mode}]", marks=marks))
    return params


def pick(value: Any, mode: str) -> Any:
    """``{"by_mode": {...}}`` resolved for ``mode``; anything else as it is."""
    if isinstance(value, dict) and set(value) == {"by_mode"}:
        return value["by_mode"][mode]
    return value


# -- messages ------------------------------------------------------------------------------
def message(spec: dict) -> Message:
    """A vector's ``{"kind", "body"}`` as a message, validated by the codec's own rules."""
    return messages.from_json(Kind[spec["kind"].upper()], spec["body"])


def kind_name(msg: Message) -> str:
    return msg.KIND.name.lower()


def _canon(to: str, kind: str, body: dict) -> str:
    return orjson.dumps({"to": to, "kind": kind, "body": body}, option=orjson.OPT_SORT_KEYS).decode()


def expected_sent(step: dict, mode: str) -> list[str]:
    """The step's ``expect`` as a sorted multiset of canonical strings (``to`` lists expanded)."""
    out = []
    for e in pick(step["expect"], mode):
        for to in e["to"] if isinstance(e["to"], list) else [e["to"]]:
            # Normalise the body through the codec too (canonical IPs, tuple URLs as lists).
            out.append(_canon(to, e["kind"], message(e).to_json()))
    return sorted(out)


def observed_sent(sent: list[tuple[str, Message]]) -> list[str]:
    return sorted(_canon(to, kind_name(m), m.to_json()) for to, m in sent)


def assert_sent(where: str, seen: list[str], want: list[str]) -> None:
    assert seen == want, f"{where}: messages sent differ\n  sent:     {_pretty(seen)}\n  expected: {_pretty(want)}"


def _pretty(items: list[str]) -> str:
    return "\n            ".join(items) if items else "(nothing)"


# -- counters ------------------------------------------------------------------------------
_SERIES = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?')
_LABEL = re.compile(r'([a-z_]+)="([^"]*)"')


def series(text: str) -> tuple[str, dict[str, str]]:
    """``'rejected{reason="unknown-number"}'`` -> ``("rejected", {"reason": "unknown-number"})``."""
    m = _SERIES.fullmatch(text)
    assert m, f"not a counter series: {text!r}"
    return m.group(1), dict(_LABEL.findall(m.group(2) or ""))


def counter_mismatches(counters, expected: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Series whose value differs: ``{series: (actual, expected)}``."""
    bad = {}
    for text, want in expected.items():
        name, labels = series(text)
        got = counters.get(name, **labels)
        if got != want:
            bad[text] = (got, want)
    return bad


# -- pools ---------------------------------------------------------------------------------
_SETS = ("admitted", "concluded")
_MULTISETS = ("URL_pool", "task_pool", "unacked")
_REDUCE_POOLS = ("local_reduce_pool", "dist_reduce_pool")


def normalise_pools(pools: dict) -> dict:
    """Pools in one comparable form: sets and multisets sorted, numbers as strings."""
    out = {}
    for key, value in pools.items():
        if key in _SETS:
            out[key] = sorted({str(v) for v in value})
        elif key in _MULTISETS:
            out[key] = sorted(str(v) for v in value)
        elif key in _REDUCE_POOLS and isinstance(value, list):  # only which numbers are held
            out[key] = sorted(str(n) for n in value)
        elif key in _REDUCE_POOLS:
            out[key] = {str(n): dict(url_set) for n, url_set in value.items()}
        elif key == "task_URL":
            out[key] = {k: list(v) for k, v in value.items()}
        elif key == "ledger":  # host -> the URLs given to it, not reported finished (a set)
            out[key] = {k: sorted(v) for k, v in value.items() if v}
        else:
            raise KeyError(key)
    return out


def pools_mismatch(actual: dict, expected: dict) -> str | None:
    """None if every pool named in ``expected`` equals the one in ``actual``."""
    want = normalise_pools(expected)
    got = normalise_pools({k: list(actual[k]) if isinstance(expected[k], list) and k in _REDUCE_POOLS else actual[k]
                           for k in want})
    if got == want:
        return None
    return "\n".join(f"  {k}: got {got[k]!r}, expected {want[k]!r}" for k in want if got[k] != want[k])
