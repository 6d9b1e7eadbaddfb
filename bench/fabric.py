#!/usr/bin/env python3
"""What `pcitopo serve --fabric FILE` costs against the same server without it.

    PYTHONPATH=. .venv/bin/python bench/fabric.py [--calls N]

On the hgx-h100 fixture (materialised as a directory, read like /sys), three servers one after
the other: no fabric (the default path), `--fabric` with the one-partition-active file and calls
whose GPUs are that partition (`nvlink: require`, the check passes), and the same server with
calls that are no partition (`nvlink: warn`, the check reports). For each: resident memory after
the first Info, after N calls and its high-water mark, and the median call time over a fresh
connection per call (as virt-launcher dials). Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from harness import Server, define_new_connection, mib, proc_status
from perf_inputs import ensure_bytecode, materialise

from testkit.fabric_kit import domain_with_modules, fabric, vmi_with
from testkit.server_proc import BIN


def run(label: str, sysfs: Path, extra: list[str], domain: bytes, vmi: bytes, calls: int) -> dict:
    with Server(str(sysfs), argv=[str(BIN / "pcitopo"), "serve", *extra]) as srv:
        srv.first_info()
        idle = proc_status(srv.pid)["VmRSS"]
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            define_new_connection(srv.target, domain, vmi)
            times.append(time.perf_counter() - t0)
        st = proc_status(srv.pid)
    return {"label": label, "idle": mib(idle), "after": mib(st["VmRSS"]), "hwm": mib(st["VmHWM"]),
            "median_ms": statistics.median(times) * 1000}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=1000)
    args = ap.parse_args(argv)
    ensure_bytecode()
    sysfs = materialise("hgx-h100")
    ok = domain_with_modules("hgx-h100", {1, 3})
    bad = domain_with_modules("hgx-h100", {1, 2})
    fab = ["--fabric", fabric("hgx-h100", "active")]
    rows = [
        run("no --fabric (default)", sysfs, [], ok, vmi_with(None), args.calls),
        run("--fabric, require, exact partition", sysfs, fab, ok, vmi_with("require"), args.calls),
        run("--fabric, warn, not a partition", sysfs, fab, bad, vmi_with("warn"), args.calls),
    ]
    print(f"pcitopo serve on hgx-h100 (2 GPUs + 2 NICs per call), {args.calls} calls each")
    print(f"{'server':<38}{'RSS idle':>10}{'RSS after':>11}{'VmHWM':>9}{'median call':>13}")
    for r in rows:
        print(f"{r['label']:<38}{r['idle']:>8.1f}Mi{r['after']:>9.1f}Mi{r['hwm']:>7.1f}Mi{r['median_ms']:>10.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
