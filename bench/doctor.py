#!/usr/bin/env python3
"""What the host-readiness checks cost, in the hook and on the command line.

    PYTHONPATH=. .venv/bin/python bench/doctor.py [--samples N] [--calls N] [--smoke]

On the hgx-b200 fixture materialised as a real directory (plain open/read, like /sys; config
files of 4,096 bytes as root reads them, the sidecar itself gets 64):
1. ``run_checks`` for the 20 devices of fixtures/hgx-b200/domain.xml on a warm host model
   (what one hook call adds);
2. the hook handler in-process on a warm model, ``doctor: off`` vs ``doctor: warn`` (the
   default), interleaved so both see the same background load;
3. ``pcitopo doctor`` (all GPUs and NICs, human output) and ``--prometheus``: process wall time;
4. ``pcitopo serve``: resident memory after ``--calls`` OnDefineDomain calls, once with
   ``doctor: warn`` and once with ``doctor: off`` on the VMI, against the sidecar's budget
   (56 MiB after 1,000 calls in a 64 MiB container).
A benchmark, not a test: it asserts nothing about time. Processes it starts are stopped by PID.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness import (  # bench/harness.py: the script's own folder is first on sys.path
    Server,
    child_env,
    define_new_connection,
    interleaved,
    loadavg,
    machine_facts,
    mib,
    proc_status,
    run_wall,
    sample,
)
from perf_inputs import ensure_bytecode, materialise
from perf_table import MIB_LIMIT as BUDGET_MIB

from pcitopo.serve.options import annotation
from testkit import FIXTURES
from testkit.hookkit import vmi_json
from testkit.server_proc import BIN


def ms(s: float) -> str:
    return f"{s * 1000:.2f} ms"


def in_process(host_dir: Path, domain: bytes, n: int) -> list[tuple[str, str, str, int]]:
    from pcitopo.checks.doctor import run_checks
    from pcitopo.host.sysfs import open_host
    from pcitopo.model.tree import Bdf
    from pcitopo.serve.core import handle_define_domain

    topo = open_host(host_dir)
    placed = [d.host for d in handle_define_domain(domain, None, topo).result.report.placed]
    checks = sample(lambda: run_checks(topo, [Bdf.parse(str(b)) for b in placed]), n)
    vmi_off = vmi_json(domain, {annotation("doctor"): "off"})
    vmi_warn = vmi_json(domain, {annotation("doctor"): "warn"})
    pair = interleaved({
        "off": lambda: handle_define_domain(domain, vmi_off, topo),
        "warn": lambda: handle_define_domain(domain, vmi_warn, topo),
    }, n, warmup=3)
    return [
        ("1", f"run_checks, {len(placed)} placed devices + their bridges, warm model", ms(checks.median), checks.n),
        ("2a", "hook handler, warm model, doctor: off", ms(pair["off"].median), pair["off"].n),
        ("2b", "hook handler, warm model, doctor: warn (default)", ms(pair["warn"].median), pair["warn"].n),
        ("2c", "  added by the checks (2b - 2a)", ms(pair["warn"].median - pair["off"].median), pair["warn"].n),
    ]


def cli(host_dir: Path, n: int) -> list[tuple[str, str, str, int]]:
    env = child_env()
    base = [str(BIN / "pcitopo"), "doctor", "--sysfs", str(host_dir)]
    stats = interleaved({
        "human": lambda: run_wall(base, env),
        "prom": lambda: run_wall(base + ["--prometheus"], env),
    }, n, warmup=1)
    return [
        ("3a", "pcitopo doctor (all GPUs and NICs), process wall", ms(stats["human"].median), stats["human"].n),
        ("3b", "pcitopo doctor --prometheus, process wall", ms(stats["prom"].median), stats["prom"].n),
    ]


def server_rss(host_dir: Path, domain: bytes, calls: int, doctor: str) -> dict[str, float]:
    vmi = vmi_json(domain, {annotation("mode"): "mirror", annotation("on_error"): "fail", annotation("doctor"): doctor})
    with Server(str(host_dir)) as srv:
        srv.first_info()
        for _ in range(calls):
            define_new_connection(srv.target, domain, vmi)
        st = proc_status(srv.pid)
        log = srv.log_text()
    if '"doctor":' not in log and doctor != "off":
        raise SystemExit("the server's log lines carry no doctor findings: is the doctor running?")
    return {"rss": mib(st["VmRSS"]), "hwm": mib(st["VmHWM"]), "anon": mib(st["RssAnon"])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--smoke", action="store_true", help="a few iterations of everything")
    args = ap.parse_args(argv)
    n, calls = (3, 20) if args.smoke else (args.samples, args.calls)
    ensure_bytecode()
    host_dir = materialise("hgx-b200")
    domain = (FIXTURES / "hgx-b200" / "domain.xml").read_bytes()
    facts = machine_facts()
    load_before = loadavg()
    rows = in_process(host_dir, domain, n) + cli(host_dir, max(3, n // 5))
    mem = {d: server_rss(host_dir, domain, calls, d) for d in ("warn", "off")}
    print(f"machine: {facts['cpu']}, {facts['cpus']} CPUs, {facts['kernel']}, {facts['python']}; commit {facts['commit']}")
    print(f"load average before {load_before}, after {loadavg()} (a shared machine)")
    print(f"input: fixtures/hgx-b200 materialised as directories, fixtures/hgx-b200/domain.xml ({len(domain)} B, 20 hostdevs)\n")
    print("| # | measurement | median | n |\n|---|---|---:|---:|")
    for key, what, value, count in rows:
        print(f"| {key} | {what} | {value} | {count} |")
    for d, m in mem.items():
        verdict = "within" if m["rss"] <= BUDGET_MIB else "OVER"
        print(f"| 4 | pcitopo serve VmRSS after {calls} calls, doctor: {d} | {m['rss']:.1f} MiB "
              f"(peak {m['hwm']:.1f}, anon {m['anon']:.1f}; {verdict} the {BUDGET_MIB:.0f} MiB budget) | {calls} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
