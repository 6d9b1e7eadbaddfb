"""Load over the socket: 64 concurrent OnDefineDomain calls (a new connection each, as
virt-launcher dials) get exactly the answers the library gives in-process, and the server's
open file descriptors come back to where they were. Bounded, no timing assertions; the
numbers (RSS and descriptor slopes over 10,000 calls) come from ``bench/load.py``.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from testkit import FIXTURES
from testkit.hookproto import info_pb2, info_pb2_grpc, v1alpha1_pb2, v1alpha1_pb2_grpc, v1alpha3_pb2, v1alpha3_pb2_grpc
from testkit.server_proc import PrivateServer
from testkit.strategies import fixture_world
from testkit.workload import expected_answer, mixed_calls

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
    srv = PrivateServer(FIXTURES / HOST, prefix="pcitopo-load-")
    try:
        srv.wait_for_socket(60)
        yield srv.proc, srv.socket
    finally:
        srv.stop()


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
    calls = mixed_calls(HOST)
    want = {name: expected_answer(host, d, v) for name, d, v in calls}
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
