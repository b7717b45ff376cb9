"""The layering rule of docs/ARCHITECTURE.md, checked on the source: imports only go down
(front ends -> harness -> service -> roles -> adapters -> codec), the two roles do not
import each other, and no two modules import each other, directly or round a longer
loop. Imports inside functions count too: a late import is still a dependency."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dedupnet", "local_host", "center_host")

#: Layer of a module: the longest matching prefix wins; higher may import lower.
LAYERS = {
    "dedupnet.codec": 0,
    "dedupnet.schemas": 0,
    "dedupnet.adapters": 1,
    "local_host": 2,
    "center_host": 2,
    "dedupnet.service": 3,
    "dedupnet.harness": 4,
    "dedupnet.cli": 5,
    "dedupnet.scrapy": 5,
    "dedupnet": 5,  # the package itself (its __init__ holds only the version)
}


def layer_of(module: str) -> int:
    prefixes = [p for p in LAYERS if module == p or module.startswith(p + ".")]
    if not prefixes:
        raise AssertionError(f"{module} is in no layer: add it to docs/ARCHITECTURE.md and LAYERS")
    return LAYERS[max(prefixes, key=len)]


def role_of(module: str) -> str | None:
    top = module.split(".")[0]
    return top if top in ("local_host", "center_host") else None


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``module`` imports (``from a import b`` counts ``a.b`` if that
    is a module, else ``a``)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in known else base)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m for m in out if m in known and m != module}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {m: imports_of(m, p, set(found)) for m, p in found.items()}


def upward(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for m, targets in g.items():
        for t in sorted(targets):
            if layer_of(t) > layer_of(m):
                bad.append(f"{m} (layer {layer_of(m)}) imports {t} (layer {layer_of(t)})")
            elif role_of(m) and role_of(t) and role_of(m) != role_of(t):
                bad.append(f"{m} imports the other role's {t}")
    return bad


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer_and_imports_only_go_down():
    g = graph()
    assert len(g) > 40 and "dedupnet.codec.wire" in g and "center_host.protocol" in g
    assert upward(g) == []


def test_no_two_modules_import_each_other():
    assert cycles(graph()) == []


def test_the_sans_io_cores_import_no_io():
    """The protocol state machines (h11's shape) see only the codec: events in, actions
    out; their counters and the pools' key names are codec modules too."""
    g = graph()
    cores = ("local_host.protocol", "local_host.local_dedup", "center_host.protocol", "center_host.events",
             "center_host.config", "center_host.sets", "center_host.stages", "center_host.homes",
             "center_host.membership", "center_host.ledger", "center_host.claims", "center_host.backlog")
    for core in cores:
        assert {t for t in g[core] if layer_of(t) >= 1} <= set(cores), core  # the codec, and each other


def test_every_package_is_listed_for_the_wheel():
    """pyproject.toml lists the packages a wheel holds (packages.find cannot name
    dedupnet.schemas, mapped from the top-level schemas/): a room missing there would be
    missing from an installed dedupnet, while an editable install hides it."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for package in PACKAGES
             for p in (ROOT / package).rglob("__init__.py")}
    assert sorted(found - listed) == []


def test_the_checks_fail_on_an_upward_import_and_on_a_cycle():
    g = graph()
    g["dedupnet.codec.wire"] = g["dedupnet.codec.wire"] | {"dedupnet.harness.sim"}
    assert any("dedupnet.codec.wire (layer 0) imports dedupnet.harness.sim" in b for b in upward(g))
    assert any({"dedupnet.codec.wire", "dedupnet.harness.sim"} <= set(c) for c in cycles(g))
    g = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": set()}
    assert cycles(g) == [["a.x", "a.y", "a.z"]]
    g = {"local_host.daemon": {"center_host.protocol"}, "center_host.protocol": set()}
    assert upward(g) == ["local_host.daemon imports the other role's center_host.protocol"]


def imported_test_files(source: str) -> list[str]:
    """The test files that ``source`` (a module under tests/) imports, inside functions too."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "tests"):
            base = "." * node.level + (node.module or "")
            if any(p.startswith("test_") for p in (node.module or "").split(".")):
                found.append(base)
            found += [f"{base}{'' if base.endswith('.') else '.'}{a.name}" for a in node.names if a.name.startswith("test_")]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names
                      if a.name.split(".")[0] == "tests" and any(p.startswith("test_") for p in a.name.split("."))]
    return found


def test_no_test_file_imports_another():
    """What test files share is in helper modules (tests/helpers.py, tests/crawling.py,
    tests/netns_lab.py, ...) and fixtures in tests/conftest.py: a test file that imported
    another would run that file's module code when collected, and break if it were renamed."""
    offenders = {str(p.relative_to(ROOT)): found for p in sorted((ROOT / "tests").rglob("*.py"))
                 if (found := imported_test_files(p.read_text()))}
    assert offenders == {}
    assert imported_test_files("from .test_netns import Daemon") == [".test_netns"]
    assert imported_test_files("def f():\n    from tests import test_scrapy\n") == ["tests.test_scrapy"]
    assert imported_test_files("import tests.test_crawler") == ["tests.test_crawler"]
    assert imported_test_files("from .helpers import until\nfrom dedupnet.x import test_y\nimport test_z") == []
