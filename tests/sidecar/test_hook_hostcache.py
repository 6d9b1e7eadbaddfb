"""The server reuses the host model and the doctor's findings across calls, and each
thing that can change under a running sidecar ends the reuse: a rebind (the ``driver`` link),
an IOMMU group change (the ``iommu_group`` link) and a new capture at the ``--sysfs`` path.

Every test runs the hook handler the server runs (``handle_define_domain`` with the server's
:class:`HostCache`) on a real sysfs-shaped directory or capture file, changes the host the way
the kernel (or a new ``pcitopo capture``) would, and shows the next call sees it.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from pcitopo.host.sources import PCI_DEVICES_DIR, MemoryTree
from pcitopo.model.tree import Bdf
from pcitopo.serve.core import handle_define_domain
from pcitopo.serve.hooks import HostCache
from testkit.hookkit import REPO, fixture_domain, vmi_json

GPU = "0000:3a:00.0"  # GPU2 of hgx-h100 (hgx-h100-faults binds it to nvidia)
NIC = "0000:5c:00.0"  # NIC5 of hgx-h100 (hgx-h100-faults puts it in GPU3's group)


def finding(outcome, check: str, bdf: str) -> str:
    (f,) = [f for f in outcome.doctor.findings if f.check == check and f.bdf == bdf]
    return f.status


@pytest.fixture
def host_dir(tmp_path) -> Path:
    """hgx-h100 as a sysfs directory a test may change (the kernel's view after a rebind)."""
    root = tmp_path / "sys"
    MemoryTree.from_tarball(REPO / "fixtures" / "hgx-h100" / "sysfs.tar.gz").write_dir(root)
    return root


def device_dir(root: Path, bdf: str) -> Path:
    return Path(os.path.realpath(root / PCI_DEVICES_DIR / bdf))


def relink(link: Path, target: str) -> None:
    tmp = link.with_name(link.name + ".new")
    os.symlink(target, tmp)
    os.replace(tmp, link)


def call(cache: HostCache):
    domain = fixture_domain("hgx-h100")
    return handle_define_domain(domain, vmi_json(domain), cache)


def test_the_model_and_the_diagnoses_are_reused_while_nothing_changes(host_dir):
    reasons: list[str] = []
    cache = HostCache(str(host_dir), on_reopen=reasons.append)
    first = call(cache)
    topo = cache()
    second = call(cache)
    assert cache() is topo, "the model is read once"
    assert second.doctor is first.doctor, "the findings are computed once for the same devices"
    assert second.xml == first.xml
    assert reasons == []


def test_a_rebind_is_seen_by_the_next_call(host_dir):
    reasons: list[str] = []
    cache = HostCache(str(host_dir), on_reopen=reasons.append)
    before = call(cache)
    topo = cache()
    assert finding(before, "vfio-driver", GPU) == "ok"
    dev = device_dir(host_dir, GPU)
    drivers = host_dir / "bus" / "pci" / "drivers"
    # Handed back to the host driver: override cleared, unbound from vfio-pci, probed.
    (dev / "driver_override").write_text("(null)\n")
    relink(dev / "driver", os.path.relpath(drivers / "nvidia", dev))
    after = call(cache)
    assert finding(after, "vfio-driver", GPU) == "fail"
    assert cache() is not topo and cache().function(Bdf.parse(GPU)).driver == "nvidia"
    assert reasons == [f"{GPU} driver vfio-pci -> nvidia"]
    assert after.xml == before.xml, "a rebind does not move the device in the guest"
    # Bound back: seen again, and reused from then on.
    (dev / "driver_override").write_text("vfio-pci\n")
    relink(dev / "driver", os.path.relpath(drivers / "vfio-pci", dev))
    again = call(cache)
    assert finding(again, "vfio-driver", GPU) == "ok" and len(reasons) == 2
    assert call(cache).doctor is again.doctor


def test_an_iommu_group_change_is_seen_by_the_next_call(host_dir):
    reasons: list[str] = []
    cache = HostCache(str(host_dir), on_reopen=reasons.append)
    before = call(cache)
    assert finding(before, "iommu-group", NIC) == "ok"
    gpu, nic = device_dir(host_dir, GPU), device_dir(host_dir, NIC)
    # The NIC joins the GPU's group: its link moves, and the group lists both.
    gpu_group = Path(os.path.realpath(gpu / "iommu_group"))
    old_group = Path(os.path.realpath(nic / "iommu_group"))
    relink(nic / "iommu_group", os.path.relpath(gpu_group, nic))
    os.symlink(os.path.relpath(nic, gpu_group / "devices"), gpu_group / "devices" / NIC)
    os.unlink(old_group / "devices" / NIC)
    after = call(cache)
    assert finding(after, "iommu-group", NIC) == "fail" and finding(after, "iommu-group", GPU) == "fail"
    assert reasons == [f"{NIC} IOMMU group {old_group.name} -> {gpu_group.name}"]


def test_a_new_capture_is_seen_by_the_next_call(tmp_path):
    capture = tmp_path / "node.tar.gz"
    shutil.copyfile(REPO / "fixtures" / "hgx-h100" / "sysfs.tar.gz", capture)
    reasons: list[str] = []
    cache = HostCache(str(capture), on_reopen=reasons.append)
    before = call(cache)
    topo = cache()
    assert finding(before, "vfio-driver", GPU) == "ok"
    # `pcitopo capture -o node.tar.gz` again, on a host that has since changed (written aside,
    # then renamed over the old one).
    shutil.copyfile(REPO / "fixtures" / "hgx-h100-faults" / "sysfs.tar.gz", tmp_path / "node.tar.gz.new")
    os.replace(tmp_path / "node.tar.gz.new", capture)
    after = call(cache)
    assert cache() is not topo
    assert finding(after, "vfio-driver", GPU) == "fail"
    assert finding(after, "iommu-group", NIC) == "fail"
    assert reasons == [f"new capture at {capture}"]


def test_sixteen_cold_calls_at_once_agree_round_after_round():
    """The server's 16-concurrent-calls case without the gRPC around it, many times over: each
    round a new cache (a cold host model), 16 threads released together by a barrier. The NCCL
    tree the calls share used to hand a thread a node another thread was still filling (its
    parent not yet in), so a device dropped out of some calls' NCCL file: about half the rounds
    gave two or three different answers."""
    sysfs = str(REPO / "fixtures" / "hgx-h100")
    domain = fixture_domain("hgx-h100")
    vmi = vmi_json(domain)
    expected = (REPO / "fixtures" / "hgx-h100" / "expected.xml").read_bytes()
    threads_n, rounds = 16, 8
    for round_no in range(rounds):
        cache = HostCache(sysfs)
        barrier = threading.Barrier(threads_n)
        results: list[bytes | BaseException] = [b""] * threads_n

        def call(i: int) -> None:
            try:
                barrier.wait()
                results[i] = handle_define_domain(domain, vmi, cache).xml
            except BaseException as e:  # reported below
                results[i] = e

        threads = [threading.Thread(target=call, args=(i,)) for i in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, errors[0]
        wrong = sum(r != expected for r in results)
        assert wrong == 0, f"round {round_no}: {wrong} of {threads_n} answers differ from fixtures/hgx-h100/expected.xml"
