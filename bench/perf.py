#!/usr/bin/env python3
"""What the hook costs, against the physical floor, the shim way and KubeVirt's budget.

    PYTHONPATH=. .venv/bin/python bench/perf.py [--smoke] [--samples N] [--calls N] [--starts N]
                                   [--results FILE] [--json FILE] [--tree DIR] [--code]

Prints one table; every figure is measured in the same run, on fixture hosts materialised as
real directories (read with plain open/read like /sys, cached under .cache/bench/):

1. floor: lxml parse + serialise of the hgx-b200 KubeVirt-shaped domain, plus plain reads of
   every sysfs attribute file (and link) of its assigned devices and their ancestors; (1h) the
   same for the 24-device VM on hgx-h100 (its domain.xml's 20 hostdevs, 8 GPUs, 8 compute and
   2 dual-port storage NICs, plus the host's 4 NVSwitches: perf_inputs.py ``H100_NVSWITCHES``);
2. the rewrite in-process on a cold host model (a fresh Topology over the directory per sample);
   (2b, 2c, 2h) the hook handler in-process on a warm model (2h: the 24-device VM);
3. OnDefineDomain over the Unix socket to a running ``pcitopo serve`` (new connection per call,
   as virt-launcher dials; realistic VMI JSON with ``pcitopo.kubevirt.io/`` annotations): the
   same allocation each call, as a VM boot's calls after its first (the server derives an
   allocation's plan, guest tree, MMIO sizing and NCCL file once per host model); (3n) the same
   with an allocation the server has not seen, a different one each call (a boot's first call);
   (3h) the 24-device VM over the socket to a second server, on hgx-h100, in the same rounds
   as (1h), then its calls in a row;
4. the shim way: one ``onDefineDomain --vmi … --domain …`` process per call (PCITOPO_SYSFS);
5. host size: (2) on sriov-4k (4,185 functions) against hgx-h100 (89), same domain;
6. ``xmlfix`` CLI wall time;
7. ``pcitopo serve``: exec → first answered Info; resident memory idle, after the calls of (3)
   and of (3h), and peak during 64 concurrent calls;
8. ``pcitopo topo --vfs --json`` on sriov-4k (4,096 VFs under 8 PFs): wall time and the peak
   resident memory of that process (the figure docs/CLI.md quotes for `pcitopo topo --vfs --json`).

Figures whose ratio is a target are measured in rounds ((1), (3), (3n), (4), (1h) and (3h) one after the other,
then again; likewise (5a) and (5b)), so both sides of a ratio see the same background load.
Then the ratios against the targets. ``--smoke`` runs everything with a few iterations
(what CI runs: it proves the harness works, it asserts nothing about time).

``--tree DIR`` measures DIR/src/pcitopo/ (an older commit, a change under test) with this harness,
fixtures and venv: DIR/src goes first on PYTHONPATH, for this process (which starts again with
it) and every child (servers, shim, CLI); the table's header names the package imported and
the version the server reports. ``--code`` prints just that and measures nothing.

The script is three modules beside it: perf_inputs.py (the fixture trees, the domain, the VMI, what
the floor reads), perf_measure.py (the measurements, numbered as above) and perf_table.py (the
table and the targets).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from harness import CODE, code_env  # bench/harness.py: the script's own folder is first on sys.path
from perf_inputs import ROOT
from perf_measure import measure
from perf_table import render


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a few iterations of everything (CI); no targets judged")
    ap.add_argument("--samples", type=int, default=None, help="timed samples per in-process/process measurement (default 50; smoke 3)")
    ap.add_argument("--calls", type=int, default=None, help="OnDefineDomain calls over the socket (default 1000; smoke 10)")
    ap.add_argument("--starts", type=int, default=None, help="server starts for exec -> first Info (default 30; smoke 2)")
    ap.add_argument("--results", metavar="FILE", help="also write the table as Markdown to FILE (bench/RESULTS.md)")
    ap.add_argument("--json", metavar="FILE", help="also write every number as JSON")
    ap.add_argument("--tree", metavar="DIR", help="measure the src/pcitopo/ of another tree (e.g. `git archive` of an "
                    "older commit) with this harness, fixtures and venv: a before/after comparison under the same load")
    ap.add_argument("--code", action="store_true", help="measure nothing: print (JSON) which src/pcitopo/ would be measured, "
                    "as this process imports it and as a `pcitopo serve` child reports it")
    args = ap.parse_args(argv)
    if args.tree:
        CODE["root"] = Path(args.tree).resolve()
        if os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] != str(CODE["root"] / "src"):
            # Start again with the other tree first on PYTHONPATH (ahead of the editable
            # install), so this process imports its src/pcitopo/ as the children do.
            os.execve(sys.executable, [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])], code_env())
    if args.code:
        from perf_inputs import HOST, materialise
        from perf_measure import code_facts

        print(json.dumps(code_facts(str(materialise(HOST))), indent=2))
        return 0
    smoke = args.smoke
    args.samples = args.samples or (3 if smoke else 50)
    args.calls = args.calls or (10 if smoke else 1000)
    args.starts = args.starts or (2 if smoke else 30)
    command = " ".join(["PYTHONPATH=.", os.path.relpath(sys.executable, ROOT), "bench/perf.py",
                        *(argv if argv is not None else sys.argv[1:])])
    res = measure(args)
    text = render(res, command)
    print(text, end="")
    if args.results:
        Path(args.results).write_text(
            "# bench/perf.py: the last full run\n\n"
            "`make bench` runs the command below and rewrites this file; `bench/perf_table.py` defines the targets, "
            "`bench/perf.py`'s docstring says how each is measured.\n\n" + text)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
