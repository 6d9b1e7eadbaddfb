"""Sustained load on `pcitopo serve`: resident memory and open descriptors over many calls.

    PYTHONPATH=. .venv/bin/python bench/load.py [--host hgx-b200] [--sequential 10000] [--concurrency 64]
                                   [--concurrent-calls 6400] [--sample-every 250]

Starts the server on a fixture host (a child process, stopped by its PID), then:
1. warm-up (imports, caches, the server's thread pool);
2. ``--sequential`` OnDefineDomain calls one after the other, a new connection each, as
   virt-launcher dials;
3. ``--concurrent-calls`` calls from ``--concurrency`` client threads at once.
The calls cycle through a mixed workload (whole host, subsets, guest NUMA or not, a preplaced
domain, a bad BDF with and without passthrough, ``mode: off``, a bad annotation). Every answer
is compared with what the library returns in-process. The server's RSS (VmRSS) and descriptor
count are sampled every ``--sample-every`` calls; the script prints the samples and the
least-squares slopes (KiB and descriptors per 1,000 calls) after warm-up. Flat memory and
descriptors means both slopes are about zero. Exit 1 if any answer was wrong.

A benchmark, not a test: it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

from testkit import FIXTURES
from testkit.server_proc import PrivateServer
from testkit.strategies import fixture_world
from testkit.workload import expected_answer, mixed_calls

MEMORY_LIMIT_KIB = 64 * 1000 * 1000 // 1024  # KubeVirt's default sidecar limit: 64M


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, RssAnon) in KiB. The anonymous part is what a memory cgroup cannot reclaim;
    the file-backed rest (shared libraries) can be dropped and paged in again."""
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "RssAnon:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out.get("VmRSS", -1), out.get("RssAnon", -1)


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of y over x, per 1,000 x."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    if var == 0:
        return 0.0
    return 1000 * sum((x - mx) * (y - my) for x, y in points) / var


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.calls = mixed_calls(args.host)
        host = fixture_world(args.host).host
        self.want = {name: expected_answer(host, d, v) for name, d, v in self.calls}
        self.wrong = 0
        self.done = 0
        self.lock = threading.Lock()
        self.samples: list[tuple[str, int, int, int, int, float]] = []  # phase, calls, RSS KiB, anon KiB, fds, cpu s

    def call(self, i: int) -> None:
        name, domain, vmi = self.calls[i % len(self.calls)]
        try:
            got = ("ok", self.server.define(domain, vmi, timeout=120))
        except grpc.RpcError as e:
            got = (e.code().name, e.details())
        with self.lock:
            self.done += 1
            if got != self.want[name]:
                self.wrong += 1

    def sample(self, phase: str) -> None:
        pid = self.server.pid
        rss, anon = rss_kib(pid)
        self.samples.append((phase, self.done, rss, anon, fds(pid), cpu_s(pid)))

    def run(self) -> int:
        a = self.args
        self.server = PrivateServer(FIXTURES / a.host, prefix="pcitopo-bench-")
        try:
            try:
                self.server.wait_for_socket(60)
            except AssertionError as e:
                raise SystemExit(f"server did not start: {e}") from None
            for i in range(a.warmup):
                self.call(i)
            self.sample("warm")
            t0 = time.perf_counter()
            for i in range(a.sequential):
                self.call(i)
                if (i + 1) % a.sample_every == 0:
                    self.sample("seq")
            t_seq = time.perf_counter() - t0
            t0 = time.perf_counter()
            batch = max(a.concurrency, a.sample_every // a.concurrency * a.concurrency)
            issued = 0
            with ThreadPoolExecutor(max_workers=a.concurrency) as pool:
                while issued < a.concurrent_calls:
                    n = min(batch, a.concurrent_calls - issued)
                    list(pool.map(self.call, range(issued, issued + n)))
                    issued += n
                    self.sample("conc")
            t_conc = time.perf_counter() - t0
            time.sleep(1.0)  # let connections close before the last sample
            self.sample("end")
        finally:
            self.server.stop()
        self.report(t_seq, t_conc)
        return 1 if self.wrong else 0

    def report(self, t_seq: float, t_conc: float) -> None:
        a = self.args
        print(f"pcitopo serve on fixtures/{a.host}: {self.done} OnDefineDomain calls "
              f"({a.warmup} warm-up, {a.sequential} sequential, {a.concurrent_calls} from {a.concurrency} threads)")
        print(f"sequential: {a.sequential / t_seq:.0f} calls/s; concurrent: {a.concurrent_calls / t_conc:.0f} calls/s "
              f"(2-core machine, client and server share it)")
        print(f"wrong answers: {self.wrong}")
        print()
        print(f"{'phase':>5} {'calls':>7} {'RSS KiB':>9} {'anon KiB':>9} {'fds':>4} {'cpu s':>7}")
        step = max(1, len(self.samples) // 24)
        shown = self.samples[::step] + ([self.samples[-1]] if (len(self.samples) - 1) % step else [])
        for phase, calls, rss, anon, nfd, cpu in shown:
            print(f"{phase:>5} {calls:>7} {rss:>9} {anon:>9} {nfd:>4} {cpu:>7.1f}")
        print()
        for phase in ("seq", "conc"):
            pts = [s for s in self.samples if s[0] == phase]
            if len(pts) < 2:
                continue
            # Slopes over the second half of each phase: past allocator and cache warm-up.
            half = pts[len(pts) // 2:]
            rss_slope = slope([(s[1], s[2]) for s in half])
            anon_slope = slope([(s[1], s[3]) for s in half])
            fd_slope = slope([(s[1], s[4]) for s in half])
            print(f"{phase:>4}: RSS {pts[0][2]} → {pts[-1][2]} KiB (anon {pts[0][3]} → {pts[-1][3]}), "
                  f"second-half slope {rss_slope:+.1f} KiB/1000 calls (anon {anon_slope:+.1f}); "
                  f"fds {pts[0][4]} → {pts[-1][4]}, slope {fd_slope:+.2f}/1000 calls")
        peak = max(s[2] for s in self.samples)
        peak_anon = max(s[3] for s in self.samples)
        print(f"peak RSS {peak} KiB ({peak / MEMORY_LIMIT_KIB:.0%} of KubeVirt's default 64M sidecar limit), "
              f"peak anonymous {peak_anon} KiB ({peak_anon / MEMORY_LIMIT_KIB:.0%})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="hgx-b200")
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--sequential", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--concurrent-calls", type=int, default=6_400)
    p.add_argument("--sample-every", type=int, default=250)
    return Bench(p.parse_args()).run()


if __name__ == "__main__":
    sys.exit(main())
