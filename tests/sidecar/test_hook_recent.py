"""What the hook derives per allocation (the plan, the guest tree and its pair classes,
the MMIO sizing with SeaBIOS's model, NCCL's file, the pair counts, the pairing verdict, the
controllers as written, the doctor's findings) is kept per host model by the layer that derives
it (src/pcitopo/model/keep.py) and reused by the next call with the same allocation: a VM
boot's repeated OnDefineDomain calls, or another VM given the same devices.

What these tests hold: a warm server answers every domain byte-identically to a cold rewrite,
whatever the order and repetition of allocations (the reuse is keyed by all it reads); the
reuse happens; the memory stays bounded; and a rebind, an IOMMU group change or a new capture
(which give a new host model, ``test_hook_hostcache.py``) start from nothing.
"""

from __future__ import annotations

import gc
import os
import weakref
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from lxml import etree

from pcitopo.checks.doctor import FINDINGS, KEPT_ALLOCATIONS as DOCTOR_ENTRIES
from pcitopo.guest.mmio import SIZINGS
from pcitopo.guest.rewrite import ELEMENTS, NCCL_FILES, PLANS, VERDICTS
from pcitopo.guest.verdict import PAIR_COUNTS
from pcitopo.guest.view import VIEWS
from pcitopo.host.sources import PCI_DEVICES_DIR, MemoryTree
from pcitopo.host.sysfs import open_host
from pcitopo.model.keep import ALLOCATIONS_KEPT
from pcitopo.paths.pairing import VM_PAIRS
from pcitopo.serve.core import handle_define_domain
from pcitopo.serve.hooks import HostCache
from testkit.hookkit import REPO, fixture_domain, vmi_json

HOST = "hgx-h100"
# what each layer keeps per host model and allocation
KINDS = {"plan": PLANS, "controller_elements": ELEMENTS, "guest_view": VIEWS, "verdicts": VERDICTS, "mmio_budget": SIZINGS,
         "nccl_file": NCCL_FILES, "pair_counts": PAIR_COUNTS, "vm_pairs": VM_PAIRS, "doctor": FINDINGS}
# each kind's bound: ALLOCATIONS_KEPT, but the doctor's findings keep their own (src/pcitopo/checks/doctor.py)
KEEP = {kind: DOCTOR_ENTRIES if kind == "doctor" else ALLOCATIONS_KEPT for kind in KINDS}


def kept(topo) -> dict[str, int]:
    """How many allocations each layer keeps for the model ``topo``: the kinds it has any for."""
    return {kind: len(holder(topo)) for kind, holder in KINDS.items() if topo in holder}


def with_hostdevs(domain: bytes, keep: list[int], memory_gib: int | None = None, cpu_mode: str | None = None) -> bytes:
    """The domain with only the hostdevs at positions ``keep``: another VM shape on the node
    (and another RAM size or CPU mode, which SeaBIOS's placement depends on)."""
    root = etree.fromstring(domain)
    devices = root.find("devices")
    for i, hd in enumerate(devices.findall("hostdev")):
        if i not in keep:
            devices.remove(hd)
    if memory_gib is not None:
        root.find("memory").text = str(memory_gib << 30)
    if cpu_mode is not None:
        root.find("cpu").set("mode", cpu_mode)
    return etree.tostring(root)


def cold(domain: bytes, sysfs: str):
    """What a fresh server (a new host model, nothing remembered) answers."""
    return handle_define_domain(domain, vmi_json(domain), open_host(sysfs))


@pytest.fixture(scope="module")
def sysfs(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("h100") / "sys"
    MemoryTree.from_tarball(REPO / "fixtures" / HOST / "sysfs.tar.gz").write_dir(root)
    return str(root)


@pytest.fixture(scope="module")
def warm(sysfs) -> HostCache:
    return HostCache(sysfs)


N_HOSTDEVS = len(etree.fromstring(fixture_domain(HOST)).findall("devices/hostdev"))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.lists(st.integers(0, N_HOSTDEVS - 1), min_size=1, max_size=N_HOSTDEVS, unique=True),
                          st.sampled_from([None, 2, 64, 1024]), st.sampled_from([None, "host-model"])),
                min_size=1, max_size=4))
def test_a_warm_server_answers_every_allocation_as_a_cold_one(warm, sysfs, shapes):
    """Allocations in any order, repeated: each answer equals a cold rewrite's, to the byte,
    with the same log fields."""
    base = fixture_domain(HOST)
    for keep, memory_gib, cpu_mode in shapes + shapes[:1]:
        domain = with_hostdevs(base, sorted(keep), memory_gib, cpu_mode)
        got, want = handle_define_domain(domain, vmi_json(domain), warm), cold(domain, sysfs)
        assert got.xml == want.xml
        assert got.summary == want.summary


def test_the_second_call_of_an_allocation_reuses_what_the_first_derived(sysfs):
    cache = HostCache(sysfs)
    domain = fixture_domain(HOST)
    first = handle_define_domain(domain, vmi_json(domain), cache)
    second = handle_define_domain(domain, vmi_json(domain), cache)
    assert second.result.guest is first.result.guest, "the guest tree is derived once"
    assert second.result.nccl_topo is first.result.nccl_topo, "NCCL's file is written once"
    assert second.result.report.mmio.seabios is first.result.report.mmio.seabios, "SeaBIOS's model runs once"
    assert second.xml == first.xml
    # another VM on the node with the same devices (another name) is the same allocation
    other = domain.replace(b"<name>", b"<name>other-", 1)
    assert other != domain
    third = handle_define_domain(other, vmi_json(other, name="other-vm"), cache)
    assert third.result.guest is first.result.guest
    # a different allocation is derived anew
    fewer = with_hostdevs(domain, list(range(N_HOSTDEVS - 2)))
    assert handle_define_domain(fewer, vmi_json(fewer), cache).result.guest is not first.result.guest


def test_what_is_remembered_stays_bounded(sysfs):
    cache = HostCache(sysfs)
    base = fixture_domain(HOST)
    for n in range(1, max(KEEP.values()) + 5):
        domain = with_hostdevs(base, list(range(min(n, N_HOSTDEVS))) if n <= N_HOSTDEVS else [n % N_HOSTDEVS])
        handle_define_domain(domain, vmi_json(domain), cache)
    sizes = kept(cache())
    assert set(sizes) == set(KINDS), "every kind was kept for this model"
    assert all(sizes[kind] <= KEEP[kind] for kind in KINDS), sizes
    assert sizes["guest_view"] == KEEP["guest_view"] and sizes["doctor"] == KEEP["doctor"], "each holds as many as it may"


def test_a_rebind_starts_the_derivations_anew(tmp_path):
    """A rebind gives a new host model (test_hook_hostcache.py); what the old one remembered
    goes with it, and the answer is the cold one for the host as it is now."""
    root = tmp_path / "sys"
    MemoryTree.from_tarball(REPO / "fixtures" / HOST / "sysfs.tar.gz").write_dir(root)
    cache = HostCache(str(root))
    domain = fixture_domain(HOST)
    before = handle_define_domain(domain, vmi_json(domain), cache)
    old = cache()
    gpu = "0000:3a:00.0"
    dev = Path(os.path.realpath(root / PCI_DEVICES_DIR / gpu))
    (dev / "driver_override").write_text("(null)\n")
    tmp = dev / "driver.new"
    os.symlink(os.path.relpath(root / "bus" / "pci" / "drivers" / "nvidia", dev), tmp)
    os.replace(tmp, dev / "driver")
    after = handle_define_domain(domain, vmi_json(domain), cache)
    assert cache() is not old and cache() is not None
    assert after.result.guest is not before.result.guest
    assert after.result.report.mmio.seabios is not before.result.report.mmio.seabios
    assert set(kept(cache())) >= {"plan", "guest_view", "verdicts"}
    want = cold(domain, str(root))
    assert after.xml == want.xml and after.summary == want.summary


def test_a_model_no_longer_used_goes_with_what_was_kept_for_it(sysfs):
    """What the layers keep is found by the model object, not held by it: a model dropped (the
    host cache read the host again) is freed with everything kept for it, NCCL's tree over it
    included."""
    from pcitopo.nccl.price import nccl_tree

    topo = open_host(sysfs)
    domain = fixture_domain(HOST)
    assert handle_define_domain(domain, vmi_json(domain), topo).outcome == "rewritten"
    nccl_tree(topo)
    assert set(kept(topo)) >= {"plan", "guest_view", "verdicts", "nccl_file"}
    gone = weakref.ref(topo)
    del topo
    gc.collect()
    assert gone() is None, [type(r).__name__ for r in gc.get_referrers(gone())]
