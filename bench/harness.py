"""A small measuring harness for ``bench/perf.py``: samples, statistics, machine facts, process
memory and CPU, and a ``pcitopo serve`` child driven the way virt-launcher drives it.

Why not pyperf or pytest-benchmark: half of what the benchmark measures is not a Python callable timed in
a loop (a child's exec → first answered Info, RSS of another process at given moments, one
process per call for the shim and ``xmlfix``); both libraries would time the easy half and leave
the rest to hand-written code anyway. pyperf's worker processes and CPU pinning also do not fit a
2-core machine shared with other people's test runs. So: warm-up, N timed samples with
``time.perf_counter``, median and nearest-rank p99, machine facts and load printed with them.
"""

from __future__ import annotations

import os
import platform
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from testkit import REPO
from testkit.server_proc import PrivateServer

# Where the code under test (src/pcitopo/) comes from: this checkout, or another tree
# (``bench/perf.py --tree DIR``, e.g. an older commit for a before/after comparison). Child
# processes get it first on PYTHONPATH, ahead of the editable install.
CODE = {"root": REPO}


def code_env(env: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """``env`` (default: ours) with the code under test first on PYTHONPATH, plus ``extra``."""
    out = dict(os.environ if env is None else env)
    if CODE["root"] != REPO:
        out["PYTHONPATH"] = os.pathsep.join([str(CODE["root"] / "src")] + ([out["PYTHONPATH"]] if out.get("PYTHONPATH") else []))
    out.update(extra)
    return out


# -- samples and statistics ----------------------------------------------------------------------

@dataclass
class Stat:
    """Timed samples of one measurement, in seconds."""

    samples: list[float]
    warmup: int = 0

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def p99(self) -> float:
        """Nearest-rank 99th percentile (with fewer than 100 samples: the maximum)."""
        s = sorted(self.samples)
        return s[min(len(s) - 1, max(0, -(-99 * len(s) // 100) - 1))]

    @property
    def min(self) -> float:
        return min(self.samples)


def sample(fn: Callable[[], object], n: int, warmup: int = 3) -> Stat:
    """``warmup`` untimed calls, then ``n`` timed ones."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return Stat(out, warmup)


def interleaved(fns: dict[str, Callable[[], object]], n: int, warmup: int = 1) -> dict[str, Stat]:
    """Round-robin samples: each of ``n`` rounds times every callable once, in turn. Figures
    whose ratio matters are measured this way, so both see the same background load (this
    machine is shared). A callable returning a float reports its own time (a child process's
    wall time); otherwise the call is timed."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(warmup + n):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            got = fn()
            t = got if isinstance(got, float) else time.perf_counter() - t0
            if r >= warmup:
                out[k].append(t)
    return {k: Stat(v, warmup) for k, v in out.items()}


def timed(fn: Callable[[], float | None], n: int, warmup: int = 3) -> Stat:
    """Like :func:`sample`, for a callable that measures itself and returns seconds."""
    for _ in range(warmup):
        fn()
    return Stat([float(fn()) for _ in range(n)], warmup)


# -- machine facts -------------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def loadavg() -> str:
    try:
        with open("/proc/loadavg") as fh:
            return " ".join(fh.read().split()[:3])
    except OSError:
        return "?"


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def git_rev() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return f"{rev}{' (tree has uncommitted changes)' if dirty else ''}" if rev else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def machine_facts() -> dict[str, str]:
    mem = "?"
    try:
        with open("/proc/meminfo") as fh:
            mem = f"{int(fh.readline().split()[1]) // 1024} MiB"
    except (OSError, ValueError, IndexError):
        pass
    return {
        "cpu": cpu_model(),
        "cpus": str(os.cpu_count()),
        "memory": mem,
        "kernel": platform.release(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "libs": ", ".join(f"{d} {_version(d)}" for d in ("grpcio", "protobuf", "lxml", "pydantic", "pydantic-core")),
        "commit": git_rev(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


# -- another process's memory and CPU --------------------------------------------------------------

def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile, RssShmem (KiB), Threads, and open descriptors.

    VmRSS = RssAnon + RssFile + RssShmem: every resident page of the process, shared library
    pages included. That is the number a container's memory cgroup is charged at least (it also
    charges page cache the process read, e.g. .pyc files, which the kernel can reclaim)."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem", "Threads"):
                out[key] = int(rest.split()[0])
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mib(kib: float) -> float:
    return kib / 1024


class PeakSampler:
    """Samples a process's VmRSS every ``every`` seconds in a thread (a cross-check of VmHWM)."""

    def __init__(self, pid: int, every: float = 0.002):
        self.pid, self.every = pid, every
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, proc_status(self.pid)["VmRSS"])
            except (OSError, KeyError):
                return
            self._stop.wait(self.every)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


# -- the image's environment -----------------------------------------------------------------------

def containerfile_env() -> dict[str, str]:
    """The ENV of the Containerfile's final stage, so the server runs as the image runs it."""
    import re
    import shlex

    text = re.sub(r"\\\n\s*", " ", (REPO / "Containerfile").read_text())
    env: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.upper().startswith("FROM "):
            env = {}
        elif line.upper().startswith("ENV "):
            for item in shlex.split(line[4:]):
                k, _, v = item.partition("=")
                env[k] = v
    return env


def child_env(**extra: str) -> dict[str, str]:
    """Our environment plus the image's ENV: how the server runs in its container."""
    env = dict(os.environ)
    env.update(containerfile_env())
    return code_env(env, **extra)


def run_wall(argv: list[str], env: dict[str, str], stdin: bytes | None = None) -> float:
    """Wall time of one process from exec to exit; raises if it fails."""
    t0 = time.perf_counter()
    p = subprocess.run(argv, input=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    t = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {p.returncode}: {p.stderr.decode(errors='replace')[-500:]}")
    return t


def run_wall_rss(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    """Wall time of one process from exec to exit and its peak resident memory (ru_maxrss of
    that child alone, from wait4, in KiB like /proc's figures: :func:`mib` converts); raises if
    it fails."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    err = p.stderr.read() if p.stderr else b""
    _, status, usage = os.wait4(p.pid, 0)
    t = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {p.returncode}: {err.decode(errors='replace')[-500:]}")
    return t, usage.ru_maxrss


# -- `pcitopo serve` as virt-launcher meets it ----------------------------------------------------

@dataclass
class Start:
    socket_s: float  # exec -> socket file exists
    info_s: float  # exec -> Info answered
    refused: int  # dials refused between the file appearing and gRPC listening


class Server(PrivateServer):
    """A ``pcitopo serve`` child on a private socket, in the image's environment (default),
    stopped by its own PID."""

    def __init__(self, sysfs: str, env: dict[str, str] | None = None):
        super().__init__(sysfs, env=child_env() if env is None else env, prefix="pcitopo-bench-")

    def first_info(self, timeout: float = 60.0) -> Start:
        """Like virt-launcher: poll for the socket file (here every 1 ms; it polls every 300 ms),
        dial until connected (it retries within 2 s), then Info with a 1 s deadline. The dial is a
        plain connect() so gRPC's client reconnect backoff is not what gets measured."""
        import grpc

        from testkit.hookproto import info_pb2, info_pb2_grpc

        deadline = time.monotonic() + timeout
        while not self.socket.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {self.log_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no socket after {timeout} s: {self.log_text()[-2000:]}")
            time.sleep(0.001)
        t_sock = time.perf_counter() - self.t_exec
        refused = 0
        dial_deadline = time.monotonic() + 2.0
        while True:
            probe = socket.socket(socket.AF_UNIX)
            try:
                probe.connect(str(self.socket))
                break
            except OSError:
                refused += 1
                if time.monotonic() > dial_deadline:
                    raise
                time.sleep(0.001)
            finally:
                probe.close()
        with grpc.insecure_channel(self.target) as ch:
            info_pb2_grpc.InfoStub(ch).Info(info_pb2.InfoParams(), timeout=1.0)
        return Start(t_sock, time.perf_counter() - self.t_exec, refused)


def define_new_connection(target: str, domain: bytes, vmi: bytes, timeout: float = 60.0) -> bytes:
    """One OnDefineDomain (v1alpha3) on a fresh connection, as virt-launcher makes every call."""
    import grpc

    from testkit.hookproto import v1alpha3_pb2, v1alpha3_pb2_grpc

    with grpc.insecure_channel(target) as ch:
        return v1alpha3_pb2_grpc.CallbacksStub(ch).OnDefineDomain(
            v1alpha3_pb2.OnDefineDomainParams(domainXML=domain, vmi=vmi), timeout=timeout, wait_for_ready=True
        ).domainXML
