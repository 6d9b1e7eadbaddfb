"""The gates' own logic (``make lint``, ``make check``; docs/CI.md): how scripts/mypy_baseline.py
reads mypy and holds it to the baseline, the ruff setting that keeps the guest tool's modules on
Python 3.8, and how a test that needs a system program skips where it is missing."""

from __future__ import annotations

import importlib.util
import tomllib
from types import ModuleType

import pytest

from pcitopo.cli.guesttool import GUEST_MODULES
from testkit import REPO, needs_tool, tool_or_skip


@pytest.fixture(scope="module")
def gate() -> ModuleType:
    """scripts/mypy_baseline.py, loaded by its path (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("mypy_baseline", REPO / "scripts" / "mypy_baseline.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


OUTPUT = """\
src/pcitopo/a.py:12: error: Incompatible return value type (got "int", expected "str")  [return-value]
src/pcitopo/a.py:30:5: note: See https://mypy.readthedocs.io/en/stable/...
src/pcitopo/b.py:7: error: Name "x" already defined on line 3  [no-redef]
src/pcitopo/b.py:9: error: Name "x" already defined on line 3  [no-redef]
"""


def test_an_error_is_its_file_code_and_message_without_the_line(gate):
    assert gate.normalise(OUTPUT) == [
        'src/pcitopo/a.py:return-value:Incompatible return value type (got "int", expected "str")',
        'src/pcitopo/b.py:no-redef:Name "x" already defined on line N',
        'src/pcitopo/b.py:no-redef:Name "x" already defined on line N',
    ]


def test_moving_lines_changes_no_entry(gate):
    moved = OUTPUT.replace(":12:", ":40:").replace("line 3", "line 5").replace(":7:", ":8:")
    assert gate.normalise(moved) == gate.normalise(OUTPUT)


def test_an_error_beyond_the_baseline_is_new_and_a_fixed_one_is_gone(gate):
    baseline = ["a.py:x:one", "b.py:y:two"]
    new, gone = gate.compare(["a.py:x:one", "c.py:z:three"], baseline)
    assert (new, gone) == (["c.py:z:three"], ["b.py:y:two"])
    assert gate.compare(baseline, baseline) == ([], [])


def test_the_same_error_once_more_is_new_and_once_less_is_gone(gate):
    assert gate.compare(["a.py:x:one"] * 3, ["a.py:x:one"] * 2) == (["a.py:x:one"], [])
    assert gate.compare(["a.py:x:one"], ["a.py:x:one"] * 2) == ([], ["a.py:x:one"])


def test_update_drops_what_is_gone_and_adds_only_when_accepting_new(gate):
    baseline = ["a.py:x:one", "a.py:x:one", "b.py:y:two"]
    current = ["a.py:x:one", "c.py:z:three"]
    assert gate.updated(current, baseline, accept_new=False) == ["a.py:x:one"]
    assert gate.updated(current, baseline, accept_new=True) == ["a.py:x:one", "c.py:z:three"]


def test_the_baseline_file_reads_back_what_was_written(gate):
    entries = ["b.py:y:two", "a.py:x:one: with a colon", "a.py:x:one: with a colon"]
    text = gate.render(entries)
    assert text.startswith("#") and gate.read_baseline(text) == sorted(entries)


def test_real_mypy_output_reads_as_entries(gate, tmp_path):
    """mypy itself, on a two-error file, in the form the gate asks it for."""
    (tmp_path / "m.py").write_text('def f() -> str:\n    return 1\n\n\nx: int = "a"\n')
    status, output = gate.run_mypy(["--config-file=", "--no-incremental", "m.py"], cwd=tmp_path)
    assert status == 1, output
    assert gate.normalise(output) == [
        'm.py:assignment:Incompatible types in assignment (expression has type "str", variable has type "int")',
        'm.py:return-value:Incompatible return value type (got "int", expected "str")',
    ]


def test_ruff_keeps_the_guest_tools_modules_on_python_38():
    """pyupgrade must not move a module the guest tool bundles past 3.8 syntax or APIs."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]
    assert config["per-file-target-version"] == {f"src/pcitopo/{m}": "py38" for m in GUEST_MODULES}


def test_a_missing_program_skips_the_test_and_is_named():
    mark = needs_tool("sh", "pcitopo-no-such-program", why="for the example")
    assert mark.args == (True,)
    assert mark.kwargs["reason"] == "needs pcitopo-no-such-program on PATH (for the example)"
    assert needs_tool("sh").args == (False,)
    with pytest.raises(pytest.skip.Exception, match="needs pcitopo-no-such-program on PATH"):
        tool_or_skip("pcitopo-no-such-program")
    assert tool_or_skip("sh").endswith("/sh")
