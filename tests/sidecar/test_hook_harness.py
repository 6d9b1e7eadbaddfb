"""The sidecar against virt-launcher's behaviour (KubeVirt pkg/hooks/manager.go; docs/SOURCES.md): discovery, Info, version choice,
1-3 chained OnDefineDomain calls through libvirt's define and KubeVirt's lossy re-parse,
Shutdown; for v1alpha1, v1alpha2 and v1alpha3 clients. The final XML must be what `xmlfix`
makes of the same input, and the server must leave nothing behind."""

from __future__ import annotations

import os
import threading

import pytest

from testkit.hookkit import (
    REPO,
    VirtLauncher,
    fixture_domain,
    fixture_sysfs,
    placement,
    vmi_json,
    xmlfix,
)
from testkit.server_proc import ServerProcess, serve_argv, wait_for_socket

CASES = [
    ("hgx-b200", None),
    ("hgx-h100", None),
    ("hgx-b200", "kubevirt-numa"),  # pre-placed by KubeVirt's PCINUMAAwareTopology
    ("hgx-h100", "kubevirt-numa"),
]
VERSIONS = ["v1alpha1", "v1alpha2", "v1alpha3"]


def _expected(name: str, case: str | None) -> bytes:
    base = REPO / "fixtures" / name
    return ((base / "cases" / case) if case else base).joinpath("expected.xml").read_bytes()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name,case", CASES, ids=[f"{n}-{c or 'all'}" for n, c in CASES])
def test_virt_launcher_boot(tmp_path, name, case, version):
    hooks = tmp_path / "hooks"
    (hooks / "hook-sidecar-0").mkdir(parents=True)
    sock = hooks / "hook-sidecar-0" / "pcitopo.sock"
    sysfs = fixture_sysfs(name)
    domain = fixture_domain(name, case)
    vmi = vmi_json(domain, name=f"{name}-vm", namespace="gpu")

    # virt-launcher starts polling while the sidecar container is still starting.
    srv = ServerProcess(serve_argv(sock, sysfs), tmp_path / "server.log")
    try:
        launcher = VirtLauncher(hooks, supported=(version,), poll_s=0.3)
        (cb,) = launcher.collect()
        assert (cb.socket, cb.version) == (str(sock), version)
        assert cb.hook_points == ("OnDefineDomain", "Shutdown")
        assert launcher.info_latency_s < 1.0

        history = launcher.boot(domain, vmi, calls=3, decimal_bus=True)

        # Call 1 is the golden rewrite; every call equals xmlfix on that call's input.
        assert history[0][1] == _expected(name, case)
        for i, (inp, out) in enumerate(history, 1):
            fixed = xmlfix(inp, sysfs, vmi, tmp_path)
            assert fixed.returncode == 0, fixed.stderr
            assert out == fixed.stdout, f"call {i}: the sidecar and xmlfix disagree"
        # Calls 2 and 3 saw our output after define + re-parse and placed everything the same.
        assert placement(history[1][1]) == placement(history[2][1]) == placement(history[0][1])
        final = history[-1][1]
        assert final.count(b"<hostdev ") == domain.count(b"<hostdev ")

        calls = [r for r in srv.log_lines() if r.get("event") == "OnDefineDomain"]
        assert [r["call"] for r in calls] == [1, 2, 3]
        assert all(r["outcome"] == "rewritten" and r["version"] == version and r["vmi"] == f"gpu/{name}-vm" for r in calls)
        assert all(r["fidelity_lost"] == 0 and r["devices_placed"] == domain.count(b"<hostdev ") for r in calls)

        told = launcher.shutdown()
        if version == "v1alpha3":
            assert told == 1
            assert srv.wait(15) == 0
        else:  # older launchers have no Shutdown: the pod's end sends SIGTERM
            assert told == 0 and srv.proc.poll() is None
            srv.proc.terminate()
            assert srv.wait(15) == 0
        assert not sock.exists() and os.listdir(sock.parent) == []
        assert srv.log_lines()[-1]["event"] == "stopped"
    finally:
        srv.stop()


def test_sixteen_concurrent_calls_on_a_cold_server_agree(tmp_path):
    """16 OnDefineDomain calls at once on a fresh server (the lazy host model fills in under
    all of them): every answer is the same, and it is xmlfix's."""
    hooks = tmp_path / "hooks"
    (hooks / "hook-sidecar-0").mkdir(parents=True)
    sock = hooks / "hook-sidecar-0" / "pcitopo.sock"
    sysfs = fixture_sysfs("hgx-h100")
    domain = fixture_domain("hgx-h100")
    vmi = vmi_json(domain)
    srv = ServerProcess(serve_argv(sock, sysfs), tmp_path / "server.log")
    try:
        wait_for_socket(sock, proc=srv.proc)
        launcher = VirtLauncher(hooks)
        launcher.collect()
        barrier = threading.Barrier(16)
        results: list[bytes | BaseException] = [b""] * 16

        def call(i: int) -> None:
            try:
                barrier.wait(10)
                results[i] = launcher.on_define_domain(domain, vmi)
            except BaseException as e:  # reported below
                results[i] = e

        threads = [threading.Thread(target=call, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, errors[0]
        assert len(set(results)) == 1
        fixed = xmlfix(domain, sysfs, vmi, tmp_path)
        assert fixed.returncode == 0 and results[0] == fixed.stdout == (REPO / "fixtures/hgx-h100/expected.xml").read_bytes()
        calls = sorted(r["call"] for r in srv.log_lines() if r.get("event") == "OnDefineDomain")
        assert calls == list(range(1, 17))
    finally:
        srv.stop()
    assert not sock.exists()

