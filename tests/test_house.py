"""House rules that can be checked mechanically: no function longer than 80 lines in the
library (topology/) or the doors (sidecar/); generated code (sidecar/hookproto) aside."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

MAX_FUNCTION_LINES = 80
GENERATED = ("hookproto",)


def long_functions(source: str, name: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Every function (methods and nested ones included) spanning more than ``limit`` lines,
    from its ``def`` line to its last line."""
    out = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                out.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_the_measure_sees_a_long_function():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}", "t.py") == [f"t.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"]
    assert long_functions(f"def f():\n{body[: body.rindex('    x')]}", "t.py") == []
    nested = "class C:\n    def m(self):\n" + "".join("    " + line + "\n" for line in body.splitlines())
    assert [x.split()[1] for x in long_functions(nested, "t.py")] == ["m"]


@pytest.mark.parametrize("package", ["topology", "sidecar"])
def test_no_function_longer_than_80_lines(package):
    files = [p for p in sorted((ROOT / package).rglob("*.py")) if not set(GENERATED) & set(p.parts)]
    assert files
    too_long = [x for p in files for x in long_functions(p.read_text(), str(p.relative_to(ROOT)))]
    assert too_long == []
