"""`make bench` cannot rot: CI runs bench/perf.py in smoke mode (a few iterations of every
measurement, the real server, shim and xmlfix processes) and checks that it produced the whole
table and every number. No timing assertions: the numbers belong in bench/RESULTS.md, not here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

ROWS = (
    "floor", "floor_lxml", "floor_sysfs", "rewrite_cold", "handler_warm", "handler_model", "socket", "socket_seq", "socket_reused",
    "first_call",
    "shim", "rewrite_h100", "rewrite_4k", "xmlfix", "first_info", "first_socket",
    "floor24", "handler_warm24", "socket24", "socket24_seq",
)


def test_the_harness_measures_everything_in_smoke_mode(tmp_path):
    out = tmp_path / "bench.json"
    md = tmp_path / "RESULTS.md"
    p = subprocess.run(
        [sys.executable, str(REPO / "bench" / "perf.py"), "--smoke", "--json", str(out), "--results", str(md)],
        capture_output=True, text=True, cwd=REPO, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},  # as `make bench` runs it: the test kit from the checkout
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    res = json.loads(out.read_text())
    for key in ROWS:
        row = res["rows"][key]
        assert row["n"] >= 1 and row["median"] > 0, key
    assert res["inputs"]["d24_hostdevs"] == 24
    for key in ("idle", "boot", "boot_plain", "after_calls", "after_calls_plain", "after_calls24", "burst", "after_burst"):
        assert res["memory"][key]["VmRSS"] > 0, key
    assert res["memory"]["burst"]["errors"] == 0
    for fact in ("cpu", "cpus", "kernel", "python", "libs", "commit"):
        assert res["machine"][fact], fact
    text = p.stdout
    assert md.read_text().endswith(text)
    for needle in ("| 1 | floor", "| 3 | OnDefineDomain over the socket", "| 4 | shim", "| 5b |", "| 6 | xmlfix",
                   "exec -> first answered Info", "RSS idle", "(3) <= 1.3x (1)", "(4) >= 20x (3)", "machine:",
                   "| 1h | floor of the 24-device VM", "| 3h | OnDefineDomain over the socket, the 24-device VM", "(3h) <= 1.3x (1h)",
                   "code under test: this checkout"):
        assert needle in text, needle



def test_every_bench_script_starts():
    """Each script under bench/ imports what it names and answers --help: a script that cannot
    import (a name moved to another module) fails here, not when someone needs its numbers."""
    scripts = sorted(p for p in (REPO / "bench").glob("*.py") if "__main__" in p.read_text())
    assert len(scripts) >= 5
    for script in scripts:
        p = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, cwd=REPO, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
        assert p.returncode == 0 and p.stdout.startswith("usage:"), f"{script.name}: {p.stderr[-1000:]}"


def test_tree_measures_the_code_of_the_tree_it_names(tmp_path):
    """``--tree DIR`` measures DIR/src/pcitopo/: a copy whose version says so is what this
    process imports and what its ``pcitopo serve`` child reports serving (``--code`` measures
    nothing and says which code it would measure)."""
    copy = tmp_path / "tree"
    shutil.copytree(REPO / "src" / "pcitopo", copy / "src" / "pcitopo", ignore=shutil.ignore_patterns("__pycache__"))
    init = copy / "src" / "pcitopo" / "__init__.py"
    text = init.read_text()
    marked = text.replace('__version__ = "', '__version__ = "9.9.9+benchcopy-', 1)
    assert marked != text
    init.write_text(marked)

    def code(*extra: str) -> dict:
        p = subprocess.run([sys.executable, str(REPO / "bench" / "perf.py"), "--code", *extra], capture_output=True, text=True,
                           cwd=REPO, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
        return json.loads(p.stdout)

    got = code("--tree", str(copy))
    assert got["root"] == str(copy.resolve())
    assert got["imported"] == str((copy / "src" / "pcitopo").resolve())
    assert got["version"].startswith("9.9.9+benchcopy-") and got["server_version"] == got["version"]
    here = code()
    assert here["imported"] == str(REPO / "src" / "pcitopo") and not here["version"].startswith("9.9.9")
    assert here["server_version"] == here["version"]
