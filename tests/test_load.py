"""Load over the socket: 64 concurrent OnDefineDomain calls (a new connection each, as
virt-launcher dials) get exactly the answers the library gives in-process, and the server's
open file descriptors come back to where they were. Bounded, no timing assertions; the
numbers (RSS and descriptor slopes over 10,000 calls) come from ``bench/load.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from sidecar.config import PREFIX
from sidecar.core import handle_define_domain
from sidecar.hookproto import info_pb2, info_pb2_grpc, v1alpha1_pb2, v1alpha1_pb2_grpc, v1alpha3_pb2, v1alpha3_pb2_grpc
from sidecar.server import error_details, grpc_code
from testkit.kubevirt_sim import DomainSpec, gpus_and_nics, kubevirt_domain, pick
from testkit.strategies import build_domain, fixture_world
from topology.errors import PcitopoError

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
HOST = "hgx-b200"
CONCURRENCY = 64
ROUNDS = 3
FD_SLACK = 2  # a descriptor or two may come and go with gRPC's own housekeeping


def server_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def settle_fds(pid: int, limit_s: float = 10.0) -> int:
    """The server's descriptor count once it stops changing (closing connections is
    asynchronous); bounded, and not an assertion about time."""
    deadline = time.monotonic() + limit_s
    last = server_fds(pid)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = server_fds(pid)
        if now == last:
            return now
        last = now
    return last


@pytest.fixture(scope="module")
def server():
    d = Path(tempfile.mkdtemp(prefix="pcitopo-load-"))
    sock = d / "pcitopo.sock"
    log = open(d / "server.log", "wb")
    proc = subprocess.Popen([str(BIN / "pcitopo"), "serve", "--socket", str(sock), "--sysfs", str(REPO / "fixtures" / HOST)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert proc.poll() is None, (d / "server.log").read_text()
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.05)
        yield proc, sock
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        log.close()
        shutil.rmtree(d, ignore_errors=True)


def workload() -> list[tuple[str, bytes, bytes]]:
    """Distinct calls: whole-host and subset domains, guest NUMA or not, a domain the host
    cannot satisfy, and the same under passthrough and off."""
    world = fixture_world(HOST)
    host = world.host
    devs = gpus_and_nics(host)
    vmi = lambda **a: json.dumps({"metadata": {"name": "load", "namespace": "t", "annotations": {PREFIX + k: v for k, v in a.items()}}}).encode()
    unknown = kubevirt_domain(host, DomainSpec("bad", (devs[0],))).replace(
        f'bus="0x{devs[0].bus:02x}"'.encode(), b'bus="0xfe"', 1)
    calls = [
        ("all", kubevirt_domain(host, DomainSpec("all", tuple(devs))), b""),
        ("node0", kubevirt_domain(host, DomainSpec("n0", tuple(pick(host, devs, [0])))), b""),
        ("pair", kubevirt_domain(host, DomainSpec("pair", tuple(devs[:2]))), b""),
        ("nonuma", kubevirt_domain(host, DomainSpec("nonuma", tuple(devs), guest_numa=False)), b""),
        ("preplaced", build_domain(world, devs[:6], layout="preplaced-defined"), b""),
        ("unknown-bdf", unknown, b""),
        ("unknown-bdf-passthrough", unknown, vmi(**{"on-error": "passthrough"})),
        ("off", unknown, vmi(mode="off")),
        ("bad-annotation", unknown, vmi(mode="Mirror")),
    ]
    return calls


def expected(host, domain: bytes, vmi: bytes):
    try:
        return ("ok", handle_define_domain(domain, vmi, host).xml)
    except PcitopoError as e:
        return (grpc_code(e).name, error_details(e))


def call(sock: Path, domain: bytes, vmi: bytes, version: str = "v1alpha3"):
    pb2, pb2_grpc = (v1alpha3_pb2, v1alpha3_pb2_grpc) if version == "v1alpha3" else (v1alpha1_pb2, v1alpha1_pb2_grpc)
    with grpc.insecure_channel(f"unix:{sock}") as ch:
        try:
            res = pb2_grpc.CallbacksStub(ch).OnDefineDomain(pb2.OnDefineDomainParams(domainXML=domain, vmi=vmi), timeout=120)
            return ("ok", res.domainXML)
        except grpc.RpcError as e:
            return (e.code().name, e.details())


def test_64_concurrent_calls_answer_correctly_and_leak_no_descriptors(server):
    proc, sock = server
    host = fixture_world(HOST).host
    calls = workload()
    want = {name: expected(host, d, v) for name, d, v in calls}
    assert {w[0] for w in want.values()} >= {"ok", "INVALID_ARGUMENT"}, "the workload should mix answers and errors"

    def one_round(offset: int) -> list[tuple[str, tuple]]:
        jobs = [calls[(offset + i) % len(calls)] for i in range(CONCURRENCY)]
        with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
            versions = ["v1alpha3" if i % 2 else "v1alpha1" for i in range(CONCURRENCY)]
            results = list(pool.map(lambda jv: call(sock, jv[0][1], jv[0][2], jv[1]), zip(jobs, versions)))
        return [(name, got) for (name, _, _), got in zip(jobs, results)]

    for name, got in one_round(0):  # warm-up: imports, caches, thread pool, first connections
        assert got == want[name], f"{name}: got {got[0]} {got[1][:200]!r}"
    baseline = settle_fds(proc.pid)
    counts = []
    for r in range(ROUNDS):
        for name, got in one_round(r + 1):
            assert got == want[name], f"round {r}: {name}: got {got[0]} {got[1][:200]!r}"
        counts.append(settle_fds(proc.pid))
    assert proc.poll() is None
    print(f"server descriptors: baseline {baseline}, after each round of {CONCURRENCY}: {counts}")
    assert max(counts) <= baseline + FD_SLACK, f"descriptors grew: baseline {baseline}, after rounds {counts}"
    with grpc.insecure_channel(f"unix:{sock}") as ch:
        assert info_pb2_grpc.InfoStub(ch).Info(info_pb2.InfoParams(), timeout=10).versions
