"""Benchmark (not a test): classifying 16 devices on a huge host vs a normal one, and reading
a full host. Run: PYTHONPATH=. .venv/bin/python bench/classify.py [--samples N]

Each sample builds a fresh Topology over an already-opened source, so it measures what the
reader and classifier read and compute (lazy: the named devices and their ancestry), not the
one-off cost of decompressing a fixture tarball, which is reported on its own line.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

from pcitopo.host.sources import MemoryTree, open_source
from pcitopo.host.sysfs import SysfsReader
from pcitopo.model.tree import Role, Topology
from pcitopo.paths.classify import classify, pairs
from testkit import FIXTURES


def pick16(source) -> list:
    t = Topology(SysfsReader(source))
    return [f.bdf for f in t.functions() if t.role(f) in (Role.GPU, Role.NIC) and not f.is_vf][:16]


def sample(fn, n: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def fmt(xs: list[float]) -> str:
    xs = sorted(xs)
    p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))]
    return f"median {statistics.median(xs) * 1e3:8.3f} ms   p99 {p99 * 1e3:8.3f} ms   (n={len(xs)})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=50)
    args = ap.parse_args()
    print(f"# {platform.node()} {platform.machine()} python {platform.python_version()}")
    results = {}
    for name in ("hgx-h100", "sriov-4k"):
        t0 = time.perf_counter()
        src = open_source(FIXTURES / name)
        load = time.perf_counter() - t0
        bdfs = pick16(src)

        def classify16(src=src, bdfs=bdfs):
            t = Topology(SysfsReader(src))
            for a, b in pairs(bdfs):
                classify(t, a, b)

        def read_all(src=src):
            t = Topology(SysfsReader(src))
            for f in t.functions():
                t.role(f)

        results[name] = sample(classify16, args.samples)
        n_funcs = len(Topology(SysfsReader(src)).bdfs())
        print(f"{name:9s} open fixture tarball: {load * 1e3:8.1f} ms ({n_funcs} functions)")
        print(f"{name:9s} classify 16 devices (120 pairs): {fmt(results[name])}")
        print(f"{name:9s} read the full host:             {fmt(sample(read_all, max(5, args.samples // 10)))}")
    ratio = statistics.median(results["sriov-4k"]) / statistics.median(results["hgx-h100"])
    print(f"ratio sriov-4k / hgx-h100 for 16 devices: {ratio:.2f}x (target <= 1.2x)")
    # The live-host shape: a directory source, read lazily from disk.
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for name in ("hgx-h100", "sriov-4k"):
            MemoryTree.from_tarball(FIXTURES / name / "sysfs.tar.gz").write_dir(f"{d}/{name}")
        dir_results = {}
        for name in ("hgx-h100", "sriov-4k"):
            src = open_source(f"{d}/{name}")
            bdfs = pick16(src)
            def classify16_dir(src=src, bdfs=bdfs):
                t = Topology(SysfsReader(src))
                for a, b in pairs(bdfs):
                    classify(t, a, b)

            dir_results[name] = sample(classify16_dir, args.samples)
        r2 = statistics.median(dir_results["sriov-4k"]) / statistics.median(dir_results["hgx-h100"])
        print(f"directory sources (like /sys): hgx-h100 {fmt(dir_results['hgx-h100'])}")
        print(f"directory sources (like /sys): sriov-4k {fmt(dir_results['sriov-4k'])}")
        print(f"ratio on directory sources: {r2:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
