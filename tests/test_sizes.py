"""Modules small enough to read in one sitting and functions short enough to hold in
mind: no module of the product code over ``MAX_MODULE_LINES`` lines, no function or
method over ``MAX_FUNCTION_LINES``. A module that outgrows the limit is split by job,
a function into named steps; the limit is checked here so that it stays."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dedupnet", "local_host", "center_host")
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 60

#: Modules over the limit for now, each with the size it may not exceed: it may only
#: shrink. None: a module that outgrows the limit is split, not listed here.
OVER_THE_LIMIT: dict[str, int] = {}


def sources() -> list[Path]:
    """The product code, without code generated from the URLFrontier ``.proto``."""
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if "_pb2" not in p.name)


def long_modules(paths: list[Path]) -> list[str]:
    out = []
    for path in paths:
        name = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > OVER_THE_LIMIT.get(name, MAX_MODULE_LINES):
            out.append(f"{name}: {lines} lines")
    return out


def long_functions(source: str, name: str) -> list[str]:
    """Every function (methods and nested functions too) longer than the limit, from
    its ``def`` (or first decorator's line, not counted) to its last line."""
    out = []

    def visit(node: ast.AST, qualname: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{qualname}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines = child.end_lineno - child.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        out.append(f"{name}:{child.lineno} {inner}: {lines} lines")
                visit(child, inner + ".")
            else:
                visit(child, qualname)

    visit(ast.parse(source, name), "")
    return out


def test_no_module_is_over_the_limit():
    assert long_modules(sources()) == []


def test_no_function_is_over_the_limit():
    found = []
    for path in sources():
        found += long_functions(path.read_text(), path.relative_to(ROOT).as_posix())
    assert found == []


def test_a_module_over_the_limit_may_not_grow():
    for name, lines in OVER_THE_LIMIT.items():
        assert len((ROOT / name).read_text().splitlines()) <= lines, name


def test_the_check_finds_a_long_method_and_a_long_nested_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    source = (f"class C:\n    def long(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n\n"
              f"def short():\n    pass\n\n"
              f"def outer():\n    def inner():\n    {body.replace(chr(10), chr(10) + '    ')}\n")
    found = long_functions(source, "m.py")
    assert [f.split(" ")[1] for f in found] == ["C.long:", "outer:", "outer.inner:"]
