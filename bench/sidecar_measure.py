#!/usr/bin/env python3
"""Measure `pcitopo serve` the way virt-launcher meets it (not a timed test; prints numbers).

    python bench/sidecar_measure.py [--fixture hgx-b200] [--calls 1000] [--starts 10] [--json]

1. exec → first answered Info: spawn the server, poll for its socket every 1 ms, dial, call
   Info (1 s deadline); repeated --starts times.
2. resident memory of the server process: idle after Info, after --calls OnDefineDomain calls,
   and the peak (VmHWM) after 64 concurrent calls; RssAnon (what the memory limit cannot
   reclaim) and RssFile (shared library pages) reported apart; open file descriptors too.
3. OnDefineDomain over the socket: median and p99 per call, (a) one connection reused and
   (b) a new connection per call as virt-launcher does it.
Machine facts are printed with the numbers. Run from the repository root (or with the package
installed); the server is stopped by its own PID.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from sidecar.hookproto import info_pb2, info_pb2_grpc, v1alpha3_pb2, v1alpha3_pb2_grpc  # noqa: E402


def server_argv(sock: Path, sysfs: str) -> list[str]:
    exe = Path(sys.executable).parent / "pcitopo"
    if exe.exists():
        return [str(exe), "serve", "--socket", str(sock), "--sysfs", sysfs]
    return [sys.executable, "-m", "sidecar.server", "--socket", str(sock), "--sysfs", sysfs]


def proc_status(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "Threads"):
                out[key] = int(rest.split()[0])
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def mib(kb: int) -> float:
    return round(kb / 1024, 1)


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


class Server:
    def __init__(self, sysfs: str):
        self.dir = Path(tempfile.mkdtemp(prefix="pcitopo-bench-"))
        self.sock = self.dir / "pcitopo.sock"
        self.log = open(self.dir / "server.log", "wb")
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(server_argv(self.sock, sysfs), stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def first_info(self) -> tuple[float, float, int]:
        """(exec -> socket file, exec -> Info answered, refused dials). Like virt-launcher: poll
        for the socket (here every 1 ms), dial until connected (its dial retries within 2 s;
        here every 1 ms, without gRPC's 1 s reconnect backoff, which would measure the client),
        then Info with a 1 s deadline. Python's channel_ready_future is not used: it polls
        connectivity every 200 ms."""
        while not self.sock.exists():
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited: {(self.dir / 'server.log').read_text()}")
            time.sleep(0.001)
        t_sock = time.perf_counter() - self.t0
        refused = 0
        deadline = time.monotonic() + 2.0
        while True:
            probe = socket.socket(socket.AF_UNIX)
            try:
                probe.connect(str(self.sock))
                break
            except OSError:
                refused += 1
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.001)
            finally:
                probe.close()
        with grpc.insecure_channel(f"unix:{self.sock}") as ch:
            info_pb2_grpc.InfoStub(ch).Info(info_pb2.InfoParams(), timeout=1.0)
        return t_sock, time.perf_counter() - self.t0, refused

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def define(stub, domain: bytes, vmi: bytes) -> bytes:
    return stub.OnDefineDomain(v1alpha3_pb2.OnDefineDomainParams(domainXML=domain, vmi=vmi), timeout=60, wait_for_ready=True).domainXML


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixture", default="hgx-b200")
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--starts", type=int, default=10)
    ap.add_argument("--json", action="store_true", help="print the numbers as one JSON object")
    args = ap.parse_args()

    sysfs = str(REPO / "fixtures" / args.fixture)
    domain = (REPO / "fixtures" / args.fixture / "domain.xml").read_bytes()
    sys.path.insert(0, str(REPO / "tests" / "sidecar"))
    sys.path.insert(0, str(REPO / "tests"))
    from hookkit import vmi_json  # the same realistic VMI (a few KB, with annotations) the tests use

    vmi = vmi_json(domain)
    res: dict = {
        "machine": {
            "python": platform.python_version(), "grpcio": grpc.__version__, "cpus": os.cpu_count(),
            "kernel": platform.release(), "cpu": _cpu_model(),
        },
        "fixture": args.fixture, "domain_bytes": len(domain), "vmi_bytes": len(vmi),
    }

    # 1. exec -> first answered Info
    starts = []
    for _ in range(args.starts):
        s = Server(sysfs)
        try:
            starts.append(s.first_info())
        finally:
            s.stop()
    sock_t, info_t, refused = zip(*starts)
    res["first_info_s"] = {
        "median": round(statistics.median(info_t), 3), "max": round(max(info_t), 3), "n": len(starts),
        "socket_median": round(statistics.median(sock_t), 3),
        "info_after_socket_max_ms": round(max(i - so for so, i, _ in starts) * 1000, 1),
        "starts_with_a_refused_dial": sum(1 for r in refused if r),
    }

    # 2 + 3. one server for memory and latency
    s = Server(sysfs)
    try:
        s.first_info()
        time.sleep(0.5)
        res["idle"] = proc_status(s.proc.pid)
        ch = grpc.insecure_channel(f"unix:{s.sock}")
        stub = v1alpha3_pb2_grpc.CallbacksStub(ch)
        reused = []
        expected = define(stub, domain, vmi)
        for _ in range(args.calls):
            t = time.perf_counter()
            out = define(stub, domain, vmi)
            reused.append(time.perf_counter() - t)
            assert out == expected
        res["after_calls"] = proc_status(s.proc.pid)
        res["after_calls"]["calls"] = args.calls + 1
        fresh = []
        for _ in range(min(200, args.calls)):
            t = time.perf_counter()
            with grpc.insecure_channel(f"unix:{s.sock}") as c2:
                define(v1alpha3_pb2_grpc.CallbacksStub(c2), domain, vmi)
            fresh.append(time.perf_counter() - t)
        res["define_ms_reused_connection"] = {
            "median": round(statistics.median(reused) * 1000, 2), "p99": round(pct(reused, 99) * 1000, 2), "n": len(reused)}
        res["define_ms_new_connection"] = {
            "median": round(statistics.median(fresh) * 1000, 2), "p99": round(pct(fresh, 99) * 1000, 2), "n": len(fresh)}
        barrier = threading.Barrier(64)
        errors: list[BaseException] = []

        def burst() -> None:
            try:
                barrier.wait(30)
                assert define(stub, domain, vmi) == expected
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=burst) for _ in range(64)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join(300)
        res["burst64"] = {"wall_s": round(time.perf_counter() - t, 3), "errors": len(errors), **proc_status(s.proc.pid)}
        time.sleep(0.5)
        res["after_burst"] = proc_status(s.proc.pid)
        ch.close()
    finally:
        s.stop()

    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    m = res["machine"]
    print(f"machine: {m['cpu']}, {m['cpus']} CPUs, Linux {m['kernel']}, Python {m['python']}, grpcio {m['grpcio']}")
    print(f"input: fixtures/{args.fixture}/domain.xml ({res['domain_bytes']} B), VMI JSON {res['vmi_bytes']} B")
    fi = res["first_info_s"]
    print(f"exec -> first answered Info: median {fi['median']:.3f} s, max {fi['max']:.3f} s ({fi['n']} starts); "
          f"socket appears at median {fi['socket_median']:.3f} s, Info answered at most {fi['info_after_socket_max_ms']} ms later; "
          f"{fi['starts_with_a_refused_dial']} starts refused a dial made within 1 ms of the socket appearing (gRPC binds before it listens)")
    for label, key in (("idle", "idle"), (f"after {res['after_calls']['calls']} calls", "after_calls"),
                       ("during 64 concurrent (peak VmHWM)", "burst64"), ("after the burst", "after_burst")):
        st = res[key]
        print(f"RSS {label:34s} {mib(st['VmRSS']):5.1f} MiB (anon {mib(st['RssAnon']):5.1f}, file {mib(st['RssFile']):5.1f}; "
              f"peak {mib(st['VmHWM']):5.1f}) fds {st['fds']} threads {st['Threads']}")
    for label, key in (("reused connection", "define_ms_reused_connection"), ("new connection per call", "define_ms_new_connection")):
        d = res[key]
        print(f"OnDefineDomain over the socket, {label:24s} median {d['median']:6.2f} ms  p99 {d['p99']:6.2f} ms  (n={d['n']})")
    print(f"64 concurrent calls: {res['burst64']['wall_s']:.2f} s wall, {res['burst64']['errors']} errors")
    return 0


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


if __name__ == "__main__":
    sys.exit(main())
