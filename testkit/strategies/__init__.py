"""Hypothesis strategies: generated host worlds and KubeVirt-shaped domains over them.

A *world* is a host, described as ``.topo`` text (the DSL of :mod:`pcitopo.synth`, see
``fixtures/README``) and read back through the very reader the sidecar uses::

    .topo text → synth.parse_topo/build_tree → MemoryTree → Topology(SysfsReader(tree))

all in memory. Generated worlds have 1–4 NUMA nodes, one to three host bridges (root
complexes) per node, root-complex integrated endpoints, root ports holding endpoints, empty
ports or switches nested up to three levels: OEM-branded Broadcom parts (never flattened),
Gen4 PEX parts (flattened when nested in each other), Broadcom Gen5 two-level complexes
(``1000:c030`` sub ``1000:0xxx`` on top, ``1000:100b`` virtual switches below; NCCL flattens
them) and ConnectX-7 integrated switches (NIC on one downstream port, a second bridge pair
leading to the GPU on the other, as on DGX H100). Endpoints are GPUs, NICs (multi-function,
with SR-IOV VFs), NVMe and NVSwitch functions; some functions lack optional attributes, some
root complexes (or whole hosts) report ``numa_node`` -1, and a few hosts carry a BMC display
behind a PCIe-to-PCI bridge (a shape the mirror refuses with a PlanError). The committed
fixture hosts are worlds too (:func:`fixture_worlds`).

A *case* is a world plus a KubeVirt-shaped domain (built by :mod:`testkit.kubevirt_sim`) over a
random subset of the world's endpoints, with or without guest NUMA cells (or a single cell
without a memnode map), with or without ACPI, with other devices, and in one of the shapes a
first ``OnDefineDomain`` call can see: fresh, already defined by libvirt (root ports on
pcie-root, addresses), pre-placed by KubeVirt's ``PCINUMAAwareTopology``, or both.

The libvirt/KubeVirt simulation extensions that :mod:`testkit.kubevirt_sim` lacks live here too
(:func:`libvirt_define_all`, :func:`kubevirt_hotplug_ports`, :func:`chained_calls`): they
add the device kinds these modules generate, and the ports KubeVirt appends after the last call.

The strategies live in two modules, :mod:`.hosts` (worlds) and :mod:`.domains` (cases, mutations
and the simulation extensions); importers use the names below: ``from testkit.strategies import X``.
"""

from __future__ import annotations

from .domains import (
    LAYOUTS,
    OTHER_DEVICES,
    Case,
    add_other_devices,
    as_booted,
    build_domain,
    cases,
    chained_calls,
    kubevirt_hotplug_ports,
    libvirt_define_all,
    mutated_domains,
    single_cell,
    without_acpi,
)
from .hosts import (
    FIXTURE_HOSTS,
    World,
    endpoints,
    fixture_world,
    fixture_worlds,
    generated_worlds,
    render_topo,
    root_complexes,
    root_ports,
    switches,
    world_from_topo,
    worlds,
)

__all__ = [
    "Case", "World", "FIXTURE_HOSTS", "LAYOUTS", "OTHER_DEVICES", "add_other_devices", "as_booted", "build_domain",
    "cases", "chained_calls", "endpoints", "fixture_world", "fixture_worlds", "generated_worlds",
    "kubevirt_hotplug_ports", "libvirt_define_all", "mutated_domains", "render_topo", "root_complexes",
    "root_ports", "single_cell", "switches", "without_acpi", "world_from_topo", "worlds",
]
