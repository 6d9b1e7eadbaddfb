#!/usr/bin/env python3
"""What moving the guest-boot tier from Debian 12's stack to the Debian 13 root costs per boot.

    PYTHONPATH=. .venv/bin/python bench/e2e_stacks.py [--rounds N] [--cases smoke,golden-b200,...]

Boots the same domains on both stacks, alternating which goes first in each round so both see
the same background load, and prints per boot the wall time (start → end marker) and the CPU
time QEMU used until the end marker (user + system, all threads, from /proc/<pid>/stat). The
CPU time hardly depends on what else runs on the machine, so it compares the stacks even on a
shared, loaded machine; the wall time is what a test waits. Needs root and `make setup`.
A benchmark, not a test: it asserts nothing. Each daemon and its QEMUs are stopped by PID.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import statistics
import sys

from testkit import REPO
from testkit.e2e.guestboot import boot
from testkit.e2e.libvirtd import PrivateLibvirtd
from testkit.e2e.mmio_boot import KEEP_CPU, OVMF, large_bar_standins
from testkit.stack import DEBIAN12, debian13


def _e2e_package() -> None:
    """Load tests/e2e as the package ``e2e`` by its path (the smoke domain lives with its data in
    the smoke test), without touching sys.path."""
    if "e2e" in sys.modules:
        return
    init = REPO / "tests" / "e2e" / "__init__.py"
    spec = importlib.util.spec_from_file_location("e2e", init, submodule_search_locations=[str(init.parent)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["e2e"] = module
    spec.loader.exec_module(module)


_e2e_package()
smoke_domain = importlib.import_module("e2e.test_boot_smoke").smoke_domain


def _golden(case: str) -> bytes:
    return (REPO / "fixtures" / case / "expected.xml").read_bytes()


def _mmio(efi: bool):
    """The MMIO tier's hgx-h100 case: 8 × (128 GiB + 32 MiB) stand-ins, rewritten with settings."""
    t = importlib.import_module("e2e.test_mmio_boot")

    xml, host = t._domain("hgx-h100", efi=efi)
    out, sizes, _ = t._rewrite(xml, host)
    return large_bar_standins(out, sizes)[0]


CASES = {
    "smoke": lambda: (smoke_domain(), {}),
    "golden-b200": lambda: (_golden("hgx-b200"), {}),
    "golden-one-node": lambda: (_golden("hgx-h100/cases/one-node"), {}),
    "mmio-h100-seabios": lambda: (_mmio(False), {"keep_cpu": KEEP_CPU}),
    "mmio-h100-ovmf": lambda: (_mmio(True), {"keep_cpu": KEEP_CPU, "loader": OVMF}),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args(argv)
    stacks = [DEBIAN12, debian13()]
    daemons = {s.name: PrivateLibvirtd(stack=s) for s in stacks}
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        for lv in daemons.values():
            lv.start()
        for s in stacks:
            print(f"# {s.versions().line()}", flush=True)
        for rnd in range(args.rounds):
            for i, case in enumerate(args.cases.split(",")):
                xml, kw = CASES[case]()
                order = stacks if (rnd + i) % 2 == 0 else stacks[::-1]
                for s in order:
                    r = boot(xml, libvirtd=daemons[s.name], timeout=900, **kw)
                    cpu, run = r.timings.get("qemu_cpu", float("nan")), r.timings["run"]
                    results.setdefault((case, s.name), []).append((run, cpu))
                    print(f"{case:<20} {s.name:<9} start→end marker {run:6.1f} s   QEMU CPU {cpu:6.1f} s"
                          f"   ({r.firmware})", flush=True)
    finally:
        for lv in daemons.values():
            lv.stop()
            lv.cleanup()
    print("\n| case | Debian 12: wall / QEMU CPU | Debian 13: wall / QEMU CPU | CPU ratio 13/12 |")
    print("|---|---|---|---|")
    for case in args.cases.split(","):
        a, b = results.get((case, "debian12")), results.get((case, "debian13"))
        if not a or not b:
            continue
        wa, ca = statistics.median(x for x, _ in a), statistics.median(y for _, y in a)
        wb, cb = statistics.median(x for x, _ in b), statistics.median(y for _, y in b)
        print(f"| {case} | {wa:.1f} s / {ca:.1f} s | {wb:.1f} s / {cb:.1f} s | {cb / ca:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
