"""`make bench` cannot rot: CI runs bench/perf.py in smoke mode (a few iterations of every
measurement, the real server, shim and xmlfix processes) and checks that it produced the whole
table and every number. No timing assertions: the numbers belong in bench/RESULTS.md, not here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

ROWS = (
    "floor", "floor_lxml", "floor_sysfs", "rewrite_cold", "handler_warm", "handler_model", "socket", "socket_seq", "socket_reused", "first_call",
    "shim", "rewrite_h100", "rewrite_4k", "xmlfix", "first_info", "first_socket",
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
    for key in ("idle", "boot", "boot_plain", "after_calls", "after_calls_plain", "burst", "after_burst"):
        assert res["memory"][key]["VmRSS"] > 0, key
    assert res["memory"]["burst"]["errors"] == 0
    for fact in ("cpu", "cpus", "kernel", "python", "libs", "commit"):
        assert res["machine"][fact], fact
    text = p.stdout
    assert md.read_text().endswith(text)
    for needle in ("| 1 | floor", "| 3 | OnDefineDomain over the socket", "| 4 | shim", "| 5b |", "| 6 | xmlfix",
                   "exec -> first answered Info", "RSS idle", "(3) <= 1.3x (1)", "(4) >= 20x (3)", "machine:"):
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
