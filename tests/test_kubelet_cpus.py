"""kubelet's CPU placement (kubevirt/kubelet/) against kubelet's own test expectations.

The tables are kubernetes/kubernetes v1.33's: ``pkg/kubelet/cm/cpumanager/cpu_assignment_test.go``
(``commonTakeByTopologyTestCases``, ``TestTakeByTopologyNUMAPacked``,
``commonTakeByTopologyExtendedTestCases``, ``TestTakeByTopologyNUMADistributed``) and
``policy_static_test.go`` (``TestStaticPolicyAdd``: options-insensitive, default, full-pcpus-only
and align-by-socket=false cases), with the topologies of ``policy_test.go``; then the
Topology Manager's merge (``policy_*.go``) and the project's fixtures.
"""

from __future__ import annotations

import pytest

from pcitopo.kubevirt.kubelet.assignment import NotEnoughCpus, take_distributed, take_packed
from pcitopo.kubevirt.kubelet.cputopo import CpuInfo, CpuTopology, from_numa
from pcitopo.kubevirt.kubelet.static import DeviceResource, KubeletSettings, allocate_cpus, place
from pcitopo.kubevirt.kubelet.topologymanager import Hint, admit, masks, narrower
from pcitopo.libvirt.domain import parse_cpuset
from pcitopo.model.tree import NumaNode


def _topo(rows: dict[int, tuple[int, int, int]]) -> CpuTopology:
    return CpuTopology({c: CpuInfo(core, socket, node) for c, (core, socket, node) in rows.items()})


# policy_test.go's topologies, CPU: (CoreID, SocketID, NUMANodeID)
SINGLE_SOCKET_HT = _topo({c: (c % 4, 0, 0) for c in range(8)})
DUAL_SOCKET_HT = _topo({c: (c % 6, c % 2, c % 2) for c in range(12)})
DUAL_SOCKET_NO_HT = _topo({c: (c, c // 4, c // 4) for c in range(8)})
DUAL_SOCKET_MULTI_NUMA_HT = _topo({c: (c % 40, (c % 40) // 20, (c % 40) // 10) for c in range(80)})


def cpus(text: str) -> frozenset[int]:
    return frozenset(parse_cpuset(text)) if text else frozenset()


COMMON = [  # commonTakeByTopologyTestCases: (description, topology, available, request, expected)
    ("take zero cpus from single socket with HT", SINGLE_SOCKET_HT, "0-7", 0, ""),
    ("take one cpu from single socket with HT", SINGLE_SOCKET_HT, "0-7", 1, "0"),
    ("take one cpu from single socket with HT, some cpus are taken", SINGLE_SOCKET_HT, "1,3,5,6,7", 1, "6"),
    ("take two cpus from single socket with HT", SINGLE_SOCKET_HT, "0-7", 2, "0,4"),
    ("take all cpus from single socket with HT", SINGLE_SOCKET_HT, "0-7", 8, "0-7"),
    ("take two cpus from single socket with HT, only one core totally free", SINGLE_SOCKET_HT, "0-3,6", 2, "2,6"),
    ("take a socket of cpus from dual socket with HT", DUAL_SOCKET_HT, "0-11", 6, "0,2,4,6,8,10"),
    ("take a socket of cpus from dual socket with multi-numa-per-socket with HT", DUAL_SOCKET_MULTI_NUMA_HT,
     "0-79", 40, "0-19,40-59"),
    ("take a NUMA node of cpus from dual socket with multi-numa-per-socket with HT", DUAL_SOCKET_MULTI_NUMA_HT,
     "0-79", 20, "0-9,40-49"),
    ("... with 1 NUMA node already taken", DUAL_SOCKET_MULTI_NUMA_HT, "10-39,50-79", 20, "10-19,50-59"),
    ("take a socket and a NUMA node of cpus from dual socket with multi-numa-per-socket with HT",
     DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 60, "0-29,40-69"),
    ("... a core taken", DUAL_SOCKET_MULTI_NUMA_HT, "1-39,41-79", 60, "10-39,50-79"),
]

PACKED = COMMON + [  # TestTakeByTopologyNUMAPacked's own cases
    ("take one cpu from dual socket with HT - core from Socket 0", DUAL_SOCKET_HT, "1-5,7-11", 1, "2"),
    ("allocate 4 full cores with 3 coming from the first NUMA node (filling it up) and 1 coming from the second "
     "NUMA node", DUAL_SOCKET_HT, "0-11", 8, "0,6,2,8,4,10,1,7"),
    ("allocate 32 full cores with 30 coming from the first 3 NUMA nodes (filling them up) and 2 coming from the "
     "fourth NUMA node", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 64, "0-29,40-69,30,31,70,71"),
]

DISTRIBUTED = [(d, t, a, n, 1, e) for d, t, a, n, e in COMMON] + [  # (…, cpuGroupSize, expected)
    ("allocate 4 full cores with 2 distributed across each NUMA node", DUAL_SOCKET_HT, "0-11", 8, 1, "0,6,2,8,1,7,3,9"),
    ("allocate 32 full cores with 8 distributed across each NUMA node", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 64, 1,
     "0-7,10-17,20-27,30-37,40-47,50-57,60-67,70-77"),
    ("allocate 24 full cores with 8 distributed across the first 3 NUMA nodes", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 48,
     1, "0-7,10-17,20-27,40-47,50-57,60-67"),
    ("... (taking all but 2 from the first NUMA node)", DUAL_SOCKET_MULTI_NUMA_HT, "1-29,32-39,41-69,72-79", 48, 1,
     "1-8,10-17,20-27,41-48,50-57,60-67"),
    ("allocate 24 full cores with 8 distributed across the last 3 NUMA nodes (even though all 8 could be "
     "allocated from the first NUMA node)", DUAL_SOCKET_MULTI_NUMA_HT, "2-29,31-39,42-69,71-79", 48, 1,
     "10-17,20-27,31-38,50-57,60-67,71-78"),
    ("allocate 8 full cores with 2 distributed across each NUMA node", DUAL_SOCKET_MULTI_NUMA_HT,
     "0-2,10-12,20-22,30-32,40-41,50-51,60-61,70-71", 16, 1, "0-1,10-11,20-21,30-31,40-41,50-51,60-61,70-71"),
    ("take one cpu from dual socket with HT - core from Socket 0", DUAL_SOCKET_HT, "1-5,7-11", 1, 1, "1"),
    ("take one cpu from dual socket with HT - core from Socket 0 - cpuGroupSize 2", DUAL_SOCKET_HT, "1-5,7-11", 1, 2,
     "2"),
    ("allocate 13 full cores distributed across the first 2 NUMA nodes", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 26, 1,
     "0-6,10-16,40-45,50-55"),
    ("allocate 13 full cores distributed across the first 2 NUMA nodes (cpuGroupSize 2)", DUAL_SOCKET_MULTI_NUMA_HT,
     "0-79", 26, 2, "0-6,10-15,40-46,50-55"),
    ("allocate 31 full cores with 15 CPUs distributed across each NUMA node and 1 CPU spilling over to each of "
     "NUMA 0, 1", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 62, 1, "0-7,10-17,20-27,30-37,40-47,50-57,60-66,70-76"),
    ("allocate 31 full cores with 14 CPUs distributed across each NUMA node and 2 CPUs spilling over to each of "
     "NUMA 0, 1, 2 (cpuGroupSize 2)", DUAL_SOCKET_MULTI_NUMA_HT, "0-79", 62, 2,
     "0-7,10-17,20-27,30-36,40-47,50-57,60-67,70-76"),
    ("... and 1 CPU spilling over to each of NUMA 2, 3 (to keep balance)", DUAL_SOCKET_MULTI_NUMA_HT,
     "0-8,10-18,20-39,40-48,50-58,60-79", 62, 1, "0-7,10-17,20-27,30-37,40-46,50-56,60-67,70-77"),
    ("... 2 CPUs spilling over to each of NUMA 0, 2, 3 (to keep balance with cpuGroupSize 2)",
     DUAL_SOCKET_MULTI_NUMA_HT, "0-8,10-18,20-39,40-48,50-58,60-79", 62, 2,
     "0-7,10-16,20-27,30-37,40-47,50-56,60-67,70-77"),
    ("ensure bestRemainder chosen with NUMA nodes that have enough CPUs to satisfy the request",
     DUAL_SOCKET_MULTI_NUMA_HT, "0-3,10-13,20-23,30-36,40-43,50-53,60-63,70-76", 34, 1,
     "0-3,10-13,20-23,30-34,40-43,50-53,60-63,70-74"),
]


@pytest.mark.parametrize("desc,topo,available,count,expected", PACKED, ids=[c[0] for c in PACKED])
def test_take_by_topology_numa_packed(desc, topo, available, count, expected):
    assert take_packed(topo, cpus(available), count) == cpus(expected)


@pytest.mark.parametrize("desc,topo,available,count,group,expected", DISTRIBUTED, ids=[c[0] for c in DISTRIBUTED])
def test_take_by_topology_numa_distributed(desc, topo, available, count, group, expected):
    assert take_distributed(topo, cpus(available), count, group) == cpus(expected)


def test_more_cpus_than_available_is_kubelets_error():
    with pytest.raises(NotEnoughCpus, match="requested=5, available=4"):
        take_packed(SINGLE_SOCKET_HT, cpus("0,2,4,6"), 5)


# TestStaticPolicyAdd: (description, topology, options, numReservedCPUs, reservedCPUs, stDefaultCPUSet, request, expected or error)
STATIC = [
    ("GuPodMultipleCores, SingleSocketHT, ExpectAllocOneCore", SINGLE_SOCKET_HT, {}, 1, "", "0,1,4,5", 2, "1,5"),
    ("GuPodMultipleCores, DualSocketHT, ExpectAllocOneSocket", DUAL_SOCKET_HT, {}, 1, "", "0,1,3-11", 6, "1,3,5,7,9,11"),
    ("GuPodMultipleCores, DualSocketHT, ExpectAllocThreeCores", DUAL_SOCKET_HT, {}, 1, "", "0,2-4,6-11", 6,
     "2,3,4,8,9,10"),
    ("GuPodMultipleCores, DualSocketNoHT, ExpectAllocOneSocket", DUAL_SOCKET_NO_HT, {}, 1, "", "0,1,3-7", 4, "4-7"),
    ("GuPodMultipleCores, DualSocketNoHT, ExpectAllocFourCores", DUAL_SOCKET_NO_HT, {}, 1, "", "0,1,3,6,7", 4,
     "1,3,6,7"),
    ("GuPodMultipleCores, DualSocketHT, ExpectAllocOneSocketOneCore", DUAL_SOCKET_HT, {}, 1, "", "0,1,3-11", 8,
     "1,3,4,5,7,9,10,11"),
    ("GuPodSingleCore, SingleSocketHT, ExpectAllocOneCPU", SINGLE_SOCKET_HT, {}, 1, "", "0-7", 1, "4"),
    ("GuPodSingleCore, SingleSocketHT, ExpectError", SINGLE_SOCKET_HT, {}, 1, "", "0-7", 8,
     NotEnoughCpus("requested=8, available=7")),
    ("GuPodMultipleCores, DualSocketHT, NoAllocExpectError", DUAL_SOCKET_HT, {}, 1, "", "0,4-11", 10,
     NotEnoughCpus("requested=10, available=8")),
    ("full-pcpus-only: GuPodSingleCore, SingleSocketHT", SINGLE_SOCKET_HT, {"full_pcpus_only": True}, 1, "", "0-7", 1,
     "SMTAlignmentError: requested 1 cpus not multiple cpus per core = 2"),
    ("full-pcpus-only: GuPodManyCores, topoDualSocketHT, ExpectDoNotAllocPartialCPU", DUAL_SOCKET_HT,
     {"full_pcpus_only": True}, 2, "1,6", "0,2-5,7-11", 10,
     "SMTAlignmentError: not enough free physical CPUs: available physical CPUs = 8, requested CPUs = 10, "
     "CPUs per core = 2"),
    ("full-pcpus-only: GuPodManyCores, topoDualSocketHT, AutoReserve, ExpectAllocAllCPUs", DUAL_SOCKET_HT,
     {"full_pcpus_only": True}, 2, "", "1-5,7-11", 10, "1-5,7-11"),
]


@pytest.mark.parametrize("desc,topo,options,reserved_count,reserved,free,count,expected", STATIC,
                         ids=[c[0] for c in STATIC])
def test_static_policy_add(desc, topo, options, reserved_count, reserved, free, count, expected):
    """The fake Topology Manager of these cases gives no affinity: policy none."""
    settings = KubeletSettings(topology_policy="none", distribute=False, reserved_count=reserved_count,
                               reserved_cpus=cpus(reserved) or None, **options)
    if isinstance(expected, NotEnoughCpus):
        with pytest.raises(NotEnoughCpus, match=str(expected)):
            place(topo, count, [], settings, free=cpus(free))
        return
    got = place(topo, count, [], settings, free=cpus(free))
    if expected.startswith("SMTAlignmentError"):
        assert (got.reason, got.cpus) == (expected, ())
    else:
        assert got.admitted and frozenset(got.cpus) == cpus(expected)


def test_static_policy_reserves_the_lowest_core():
    """policy_static.go NewStaticPolicy's own comment: 8 CPUs with HT, 2 reserved -> {0,4}."""
    got = place(SINGLE_SOCKET_HT, 1, [], KubeletSettings("none", distribute=False, reserved_count=2))
    assert got.reserved == (0, 4)


def test_allocate_cpus_takes_the_affinitys_cpus_first():
    """TestStaticPolicyAdd "Align by socket: false, cpu's are taken strictly from NUMA nodes in hint"."""
    settings = KubeletSettings("none", distribute=False)
    assert allocate_cpus(DUAL_SOCKET_MULTI_NUMA_HT, settings, cpus("2,11,21,22"), 2, frozenset({0, 2})) == {2, 21}


def test_bitmask_narrower_and_iteration():
    """bitmask.go: fewer nodes first; on a tie the lower mask value (more low-numbered nodes)."""
    assert narrower(frozenset({0, 1}), frozenset({0, 2})) and narrower(frozenset({3}), frozenset({0, 1}))
    assert masks([0, 1, 2])[:4] == [frozenset({0}), frozenset({1}), frozenset({2}), frozenset({0, 1})]


GPU_NODES = {"hgx-b200": (0, 0, 1, 1, 2, 2, 3, 3), "hgx-h100": (0, 0, 0, 0, 1, 1, 1, 1),
             "hgx-b300": (0, 0, 0, 0, 1, 1, 1, 1)}
FIXTURE_NUMA = {"hgx-b200": ("0-27,112-139", "28-55,140-167", "56-83,168-195", "84-111,196-223"),
                "hgx-h100": ("0-55,112-167", "56-111,168-223"), "hgx-b300": ("0-63,128-191", "64-127,192-255")}


def _fixture(name):
    topo, _ = from_numa({i: NumaNode(i, cl) for i, cl in enumerate(FIXTURE_NUMA[name])})
    return topo, [DeviceResource("gpu", 8, GPU_NODES[name])]


def _per_node(topo, got):
    out: dict[int, int] = {}
    for c in got.cpus:
        out[topo.details[c].node] = out.get(topo.details[c].node, 0) + 1
    return out


@pytest.mark.parametrize("fixture,count,distribute,expected", [
    # kubelet's own code on these fixtures (best-effort, reserved = the first core)
    ("hgx-b200", 65, True, {1: 33, 2: 32}),
    ("hgx-b200", 65, False, {0: 9, 1: 56}),
    ("hgx-b200", 8, True, {1: 8}),
    ("hgx-h100", 65, True, {1: 65}),
    ("hgx-h100", 65, False, {0: 65}),
])
def test_fixture_pods_get_kubelets_cpus(fixture, count, distribute, expected):
    topo, gpus = _fixture(fixture)
    got = place(topo, count, gpus, KubeletSettings("best-effort", distribute=distribute))
    assert got.reserved == (0, topo.num_cpus // 2) and got.affinity == frozenset(topo.all.nodes())
    assert _per_node(topo, got) == expected


@pytest.mark.parametrize("policy", ["restricted", "single-numa-node"])
def test_gpus_on_several_nodes_are_refused_where_the_merge_is_not_preferred(policy):
    topo, gpus = _fixture("hgx-b200")
    got = place(topo, 65, gpus, KubeletSettings(policy))
    assert not got.admitted and got.cpus == () and got.reason.startswith("TopologyAffinityError")


def test_restricted_admits_what_fills_every_gpu_node():
    """169 CPUs need all 4 nodes of hgx-b200: the CPU hint and the GPUs' agree, preferred."""
    topo, gpus = _fixture("hgx-b200")
    got = place(topo, 169, gpus, KubeletSettings("restricted"))
    assert got.admitted and set(_per_node(topo, got)) == {0, 1, 2, 3}


def test_single_numa_node_keeps_a_one_node_pod_on_its_gpus_node():
    topo, _ = _fixture("hgx-h100")
    got = place(topo, 8, [DeviceResource("gpu", 1, (1,))], KubeletSettings("single-numa-node"))
    assert got.admitted and got.affinity == frozenset({1}) and _per_node(topo, got) == {1: 8}


def test_best_effort_merge_prefers_the_narrowest_agreeing_mask():
    """policy.go: a preferred merge wins over every non-preferred one."""
    cpu = [Hint(frozenset({0}), True), Hint(frozenset({1}), True), Hint(frozenset({0, 1}), False)]
    gpu = [Hint(frozenset({1}), True), Hint(frozenset({0, 1}), False)]
    assert admit("best-effort", {0, 1}, [cpu, gpu]).affinity == frozenset({1})
    assert admit("restricted", {0, 1}, [cpu, [Hint(frozenset({0, 1}), True)]]).admitted is False


def test_settings_from_a_kubelet_config_and_flags(tmp_path):
    """kubelet's numReservedCPUs is ceil(kubeReserved.cpu + systemReserved.cpu); the flags win
    over the file; what neither gives is DEPLOY.md's, said in one line."""
    from dataclasses import replace

    from pcitopo.kubevirt.kubelet.settings import KubeletRequest, resolve

    config = tmp_path / "config.yaml"
    config.write_text("kind: KubeletConfiguration\ncpuManagerPolicy: static\ncpuManagerPolicyOptions:\n"
                      "  full-pcpus-only: \"true\"\ntopologyManagerPolicy: restricted\n"
                      "kubeReserved: {cpu: 500m}\nsystemReserved: {cpu: \"1\"}\n")
    args = KubeletRequest(kubelet_config=str(config))
    got = resolve(args)
    assert got.settings == KubeletSettings("restricted", distribute=False, full_pcpus_only=True, reserved_count=2)
    assert got.assumed is None
    args = replace(args, topology_policy="best-effort", reserved_cpus="0,112")
    assert resolve(args).settings.topology_policy == "best-effort"
    assert resolve(args).settings.reserved_cpus == {0, 112}
    bare = resolve(KubeletRequest())
    assert bare.settings == KubeletSettings() and bare.assumed.startswith(
        "kubelet assumed: cpuManagerPolicyOptions distribute-cpus-across-numa, topologyManagerPolicy best-effort, one core reserved")


@pytest.mark.parametrize("name,count", [("packed", 65), ("spread", 169)])
def test_the_doctors_kubelet_data_hold_what_kubelet_gives(name, count):
    """tests/data/kubelet's checkpoints (read by `pcitopo doctor --kubelet-dir`) hold the CPUs the
    model gives the 8-GPU pod on hgx-b200 under their own config.yaml."""
    import json

    from pcitopo.kubevirt.kubelet.settings import KubeletRequest, resolve
    from testkit import REPO

    folder = REPO / "tests" / "data" / "kubelet" / name
    settings = resolve(KubeletRequest(kubelet_config=str(folder / "config.yaml"))).settings
    topo, gpus = _fixture("hgx-b200")
    state = json.loads((folder / "cpu_manager_state").read_text())
    held = cpus(next(iter(state["entries"].values()))["compute"])
    assert frozenset(place(topo, count, gpus, settings).cpus) == held
    assert cpus(state["defaultCpuSet"]) == topo.all.cpus - held
