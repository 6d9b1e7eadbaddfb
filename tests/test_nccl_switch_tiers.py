"""The NCCL topology file keeps every switch tier NCCL keeps on the host, in NCCL's order.

A guest's NCCL reads the file in place of sysfs; its graph search breaks ties by hop count and by
link order, so a missing tier, a NIC under the wrong switch or siblings in another order give
other rings and another NIC per channel than on the host. NCCL's own graph building and Broadcom
flattening (NVIDIA/nccl v2.30.7-1, ``src/graph/topo.cc``; modelled apart in
``testkit/nccl/graph.py``) judges both sides: the host's sysfs, and the file as the guest loads it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pcitopo.guest.rewrite import rewrite_domain
from pcitopo.host.sysfs import open_host
from pcitopo.model.tree import Bdf, Role
from pcitopo.nccl import topoxml as ncclxml
from pcitopo.nccl.pcitree import link_order
from pcitopo.nccl.price import nccl_busid, nccl_tree
from pcitopo.synth import host_from_topo
from testkit.kubevirt_sim import DomainSpec, gpus_and_nics, kubevirt_domain, with_efi
from testkit.nccl.graph import Graph, Node

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
GOLDEN_HOSTS = ("hgx-b200", "hgx-h100", "dgx-h100", "hgx-b300", "dgx-a100")


def _host_graph(host, busids: list[str]) -> Graph:
    tree = nccl_tree(host)
    for b in busids:
        tree.node(b)
    return Graph(tree.system, set(busids), from_sysfs=True)


def _shape(g: Graph, name: dict[str, str]) -> list:
    """The graph below each CPU as nested (device name | [children]) lists in NCCL's link order;
    switches are anonymous, devices named through ``name`` (host bus id -> a common name)."""

    def walk(node: Node):
        if node.kind == "dev":
            return name[node.busid]
        return [walk(n) for n in g.down(node)]

    return sorted((walk(cpu) for cpu in g.cpus), key=repr)


def _file_and_names(host, domain: bytes):
    result = rewrite_domain(domain, host)
    h2g = result.guest.host_to_guest
    host_ids, host_names, guest_names = [], {}, {}
    for f in host.functions():
        if host.role(f) in (Role.GPU, Role.NIC) and f.bdf in h2g:
            hb = nccl_busid(host, f)
            gb = h2g[Bdf.parse(hb)] if Bdf.parse(hb) in h2g else h2g[f.bdf]
            gbusid = str(gb.with_function(0)) if host.role(f) == Role.NIC else str(gb)
            host_names[hb] = guest_names[gbusid] = f"{host.role(f).name} {hb}"
            host_ids.append(hb)
    return sorted(set(host_ids)), (host_names, guest_names), result.nccl_topo


@pytest.mark.parametrize("fixture", GOLDEN_HOSTS)
def test_the_files_switch_tree_is_nccls_view_of_the_host(fixture):
    host = open_host(str(FIXTURES / fixture))
    _assert_file_is_nccls_view(host, (FIXTURES / fixture / "domain.xml").read_bytes())


# An HGX A100 baseboard's own switches carry NVIDIA's subsystem id (NCCL's topology print in
# NVIDIA/nccl#879 shows 1000:c010 10de:13b8 per GPU), which NCCL never flattens: all three tiers stay.
HGX_A100_PAIR = """numa 0 cpus=0-15
numa 1 cpus=16-31
rc 0000:00 numa=0
  rp 00:01.1 preset=amd-rp
    us 01:00.0 preset=pex-gen4 sub=1000:a096
      ds 02:00.0
        us 03:00.0 preset=pex-gen4 sub=10de:13b8
          ds 04:00.0
            us 05:00.0 preset=pex-gen4 sub=10de:13b8
              ds 06:00.0
                ep 07:00.0 preset=a100-sxm4
      ds 02:01.0
        us 08:00.0 preset=pex-gen4 sub=10de:13b8
          ds 09:00.0
            ep 0a:00.0 preset=cx6-ib driver=vfio-pci
          ds 09:01.0
            us 0b:00.0 preset=pex-gen4 sub=10de:13b8
              ds 0c:00.0
                ep 0d:00.0 preset=a100-sxm4
              ds 0c:01.0
                ep 0e:00.0 preset=cx6-ib driver=vfio-pci
"""


def test_three_tiers_nccl_keeps_are_three_tiers_in_the_file():
    host = host_from_topo(HGX_A100_PAIR)
    assert len(_host_graph(host, ["0000:07:00.0"]).chain("0000:07:00.0")) == 3
    domain = with_efi(kubevirt_domain(host, DomainSpec("all", tuple(gpus_and_nics(host)))))
    _assert_file_is_nccls_view(host, domain)


def _assert_file_is_nccls_view(host, domain: bytes) -> None:
    host_ids, (host_names, guest_names), file = _file_and_names(host, domain)
    assert file.data and not file.notes, file.notes
    system = ncclxml.parse(file.data)
    guest_ids = {n.get("busid") for n in system.walk() if n.name == "pci" and n.get("busid") in guest_names}
    on_host = _host_graph(host, host_ids)
    in_guest = Graph(system, guest_ids)
    assert _shape(in_guest, guest_names) == _shape(on_host, host_names)
    for b in host_ids:  # tiers: as many switches above each device as NCCL keeps on the host
        guest_b = next(g for g in guest_ids if guest_names[g] == host_names[b])
        assert len(in_guest.chain(guest_b)) == len(on_host.chain(b)), b


@pytest.mark.parametrize("fixture", [p.parent.name for p in sorted(FIXTURES.glob("*/host.topo"))])
def test_the_products_flattening_is_nccls_on_every_fixture(fixture):
    host = open_host(str(FIXTURES / fixture))
    ids = sorted({nccl_busid(host, f) for f in host.functions() if host.role(f) in (Role.GPU, Role.NIC)})
    graph, tree = _host_graph(host, ids), nccl_tree(host)
    for b in ids:
        assert [n.get("busid") for n in tree.chain(b)[1:]] == graph.chain(b), b


def test_dgx_a100_keeps_the_per_gpu_tier_and_puts_one_nic_beside_its_gpu():
    """DGX A100 (NVIDIA/nccl#1505's dump): per GPU pair a top Gen4 switch whose second level NCCL
    folds into it, then a switch per GPU. GPU 0's NIC hangs off the top switch (PXB to GPU 0),
    GPU 1's NIC sits beside GPU 1 (PIX); nvidia-smi says PXB to both."""
    host = open_host(str(FIXTURES / "dgx-a100"))
    graph = _host_graph(host, ["0000:07:00.0", "0000:0c:00.0", "0000:0f:00.0", "0000:12:00.0"])
    assert graph.chain("0000:07:00.0") == ["0000:05:00.0", "0000:01:00.0"]
    assert graph.chain("0000:0c:00.0") == ["0000:01:00.0"]
    assert graph.chain("0000:0f:00.0") == graph.chain("0000:12:00.0") == ["0000:0d:00.0", "0000:01:00.0"]


def test_the_file_orders_siblings_as_nccls_flattening_leaves_them_on_the_host():
    """A NIC straight below a top switch comes before the switch NCCL re-hangs there from a
    folded second level (it is appended), although the switch has the lower bus id: the file
    keeps NCCL's order on the host, not an order of bus ids."""
    host = host_from_topo("""numa 0 cpus=0-15
rc 0000:00 numa=0
  rp 00:01.0 preset=amd-rp
    us 01:00.0 preset=pex-gen4
      ds 02:00.0
        us 03:00.0 preset=pex-gen4
          ds 04:00.0
            us 05:00.0 preset=pex-gen4 sub=10de:13b8
              ds 06:00.0
                ep 07:00.0 preset=a100-sxm4
      ds 02:01.0
        ep 08:00.0 preset=cx6-ib driver=vfio-pci
""")
    graph = _host_graph(host, ["0000:07:00.0", "0000:08:00.0"])
    top = graph.by_busid["0000:01:00.0"]
    assert [n.busid for n in graph.down(top)] == ["0000:08:00.0", "0000:05:00.0"]
    tree = nccl_tree(host)
    switch, nic, top = (tree.node(b) for b in ("0000:05:00.0", "0000:08:00.0", "0000:01:00.0"))
    assert link_order(nic, top) < link_order(switch, top)
    result = rewrite_domain(kubevirt_domain(host, DomainSpec("pair", tuple(gpus_and_nics(host)))), host)
    gpu, nic = (str(result.guest.host_to_guest[Bdf.parse(b)]) for b in ("0000:07:00.0", "0000:08:00.0"))
    system = ncclxml.parse(result.nccl_topo.data)
    in_guest = Graph(system, {gpu, nic})
    guest_top = in_guest.by_busid[in_guest.chain(nic)[0]]
    assert [n.busid if n.kind == "dev" else "switch" for n in in_guest.down(guest_top)] == [nic, "switch"]
