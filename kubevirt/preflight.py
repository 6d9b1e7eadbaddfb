"""``pcitopo preflight``: what applying a deploy target would do to a cluster, read from its dump.

Every VM and VMI with a PCI host device is judged twice by the start model (kubevirt/starts.py):
on the cluster as dumped, and on the cluster with the target's gates and Plugin objects added.
A VM that started and would not, or that had every pcitopo setting and would lose some, is
harmed, by name. The GPU nodes, and whether the DaemonSets land on them, are kubevirt/nodes.py's
rule (a GPU resource or a GPU label; SR-IOV NICs are not GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from pcitopo.topology.errors import ConfigError

from .cluster import ClusterDump, mapping, name_of
from .sidecar_policy import Refusal, refusal
from .doors import PCITOPO_PLUGIN
from .starts import Cluster, Start, Verdict, cluster_of, doors_needed, judge, opted_in, pci_devices
from .nodes import GpuNode, gpu_node, gpu_resources
from .targets import Target, is_dev_build

DOOR_NAMES = {"hook": "the hook sidecar (hooks.kubevirt.io/hookSidecars)",
              "plugin": "the pcitopo Plugin (label pcitopo.kubevirt.io/plugin: \"true\")"}


@dataclass(frozen=True)
class Workload:
    name: str  # namespace/name
    kind: str
    devices: tuple[str, ...]
    opted_in: bool
    before: Verdict
    after: Verdict
    has: tuple[str, ...]  # the doors the VMI asks for today

    @property
    def harm(self) -> str | None:
        """What applying the target does to it: "stops starting", "loses settings", or None."""
        if self.before.starts and not self.after.starts:
            return "stops starting"
        if self.before.ok and self.after.start is Start.LOST:
            return "loses settings"
        return None


@dataclass(frozen=True)
class PolicyHarm:
    """A VM or VMI whose hooks.kubevirt.io/hookSidecars the target's Sidecar policy refuses: its
    next VMI is refused at CREATE, whatever devices it has."""

    name: str
    kind: str
    refusal: Refusal


@dataclass
class Preflight:
    target: Target
    kubevirt: str | None  # "kubevirt/kubevirt" or None: no KubeVirt CR in the dump
    before: Cluster
    after: Cluster
    release_fits: bool | None  # None: no release to judge
    gates_added: tuple[str, ...]
    plugins: tuple[tuple[str, bool], ...]  # (name, pcitopo's), as dumped
    nodes: list[GpuNode] = field(default_factory=list)
    workloads: list[Workload] = field(default_factory=list)
    policy: list[PolicyHarm] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def harmed(self) -> list[Workload]:
        return [w for w in self.workloads if w.harm]

    @property
    def refused(self) -> list[PolicyHarm]:
        """The Sidecar policy surely refuses these (the others hinge on what the dump lacks)."""
        return [p for p in self.policy if p.refusal.certain]

    @property
    def fails(self) -> bool:
        return bool(self.harmed) or bool(self.refused) or self.release_fits is False

    def doors(self) -> tuple[str, ...]:
        return doors_needed(self.after)


def preflight(dump: ClusterDump, tgt: Target, image: str | None = None) -> Preflight:
    """``image``: the image the user pins in the target's PodTemplate (None: not known)."""
    cr = dump.kubevirt
    before = cluster_of(dump)
    notes = []
    if before is None:  # judged on the target's own release, and said
        release = "v{}.{}.{}".format(*tgt.min_version)
        before = cluster_of(dump, release)
        before = Cluster(release, before.gates, before.plugins, before.not_pci,
                         f"the dump has no KubeVirt CR{'' if cr is None else ' status'}: judged as {tgt.name}'s first release")
        notes.append(f"no KubeVirt CR with status.observedKubeVirtVersion in the dump: the release is assumed to be {release} "
                     f"({tgt.name}'s first), and no feature gate is on; dump `kubectl get kubevirt -A -o yaml` to judge for real")
    after = before.with_target(tgt)
    fits = tgt.fits(before.release) if not before.assumed else None
    if is_dev_build(before.release):
        notes.append(f"KubeVirt {before.release} is a development build: its version does not say whether it carries "
                     "PR #18866 (KubeVirt writes the hostdev mode itself), so it is judged as the release it names, "
                     "without it; if it does carry it, use --target kubevirt-main (and xmlfix --check --kubevirt v1.10.0)")
    report = Preflight(tgt, cr.name if cr else None, before, after, fits,
                       tuple(g for g in tgt.gates if g not in before.gates),
                       tuple((name_of(p), name_of(p) == PCITOPO_PLUGIN) for p in dump.plugins), notes=notes)
    resources = gpu_resources({p.resource: p.vendor_device for p in cr.permitted_pci} if cr else {})
    report.nodes = [n for n in (gpu_node(node, resources) for node in dump.nodes) if n is not None]
    report.workloads = _workloads(dump, before, after)
    report.policy = _policy_harms(dump, image) if tgt.sidecar_policy else []
    report.notes += _foreign_plugin_notes(report)
    return report


def _workloads(dump: ClusterDump, before: Cluster, after: Cluster) -> list[Workload]:
    """Each VM (the VMI it starts) and each VMI without a VM of its name, with a PCI host device."""
    from .manifest import as_vmi, hook_sidecar_attachment
    from .doors import plugin_selects

    vms = {name_of(o) for o in dump.of_kind("VirtualMachine")}
    out = []
    for obj in dump.workloads:
        name = name_of(obj)
        if obj.get("kind") == "VirtualMachineInstance" and name in vms:
            continue  # the VM's template is what starts next
        try:
            vmi = as_vmi(obj, name)
        except ConfigError:  # a VM without a template: nothing to start
            continue
        devices = pci_devices(vmi, before.not_pci)
        if not devices:
            continue
        meta = mapping(vmi.get("metadata"))
        has = tuple(d for d, yes in (("hook", hook_sidecar_attachment(mapping(meta.get("annotations"))).attached),
                                     ("plugin", plugin_selects(dict(mapping(meta.get("labels")))))) if yes)
        out.append(Workload(name, str(obj.get("kind")), tuple(devices), opted_in(vmi), judge(vmi, before),
                            judge(vmi, after), has))
    return out


def _policy_harms(dump: ClusterDump, image: str | None) -> list[PolicyHarm]:
    """Every VM (its template) and lone VMI with hooks.kubevirt.io/hookSidecars that the target's
    Sidecar policy would refuse at its next start, with or without PCI devices."""
    from .manifest import HOOK_SIDECARS, as_vmi

    namespaces = {name_of(o): dict(mapping(mapping(o.get("metadata")).get("labels"))) for o in dump.of_kind("Namespace")}
    vms = {name_of(o) for o in dump.of_kind("VirtualMachine")}
    out = []
    for obj in dump.workloads:
        name = name_of(obj)
        if obj.get("kind") == "VirtualMachineInstance" and name in vms:
            continue
        try:
            vmi = as_vmi(obj, name)
        except ConfigError:
            continue
        meta = mapping(vmi.get("metadata"))
        annotations = mapping(meta.get("annotations"))
        if HOOK_SIDECARS not in annotations:
            continue
        why = refusal(annotations[HOOK_SIDECARS], namespaces.get(str(meta.get("namespace"))), image)
        if why is not None:
            out.append(PolicyHarm(name, str(obj.get("kind")), why))
    return out


def _foreign_plugin_notes(report: Preflight) -> list[str]:
    """Another vendor's Plugin object on a v1.9.x cluster: what is broken already, what pcitopo does."""
    foreign = [name for name, ours in report.plugins if not ours]
    if not (foreign and report.before.pipeline_runs and not report.before.writes_mode):
        return []
    broken = [w.name for w in report.workloads if not w.before.starts]
    return [f"Plugin object(s) {', '.join(foreign)} already run on KubeVirt {report.before.release} with gate Plugins: "
            f"every VM with a PCI host device that pcitopo's hook sidecar does not attach to fails to start already "
            f"(kubevirt#18861){': ' + ', '.join(broken) if broken else ''}. {report.target.name} "
            f"{'adds no Plugin object and ' if not report.target.plugin_objects else ''}does not change that. What pcitopo "
            "does for this cluster: its hook sidecar writes mode='subsystem', so a VM it is attached to starts (without "
            "maxphysaddr, qemu:override and controller model names while no pcitopo Plugin selects it); a VM it is not "
            "attached to starts again only when the other Plugin is removed or KubeVirt carries PR #18866 (kubevirt-main)."]


def as_json(report: Preflight) -> dict:
    """The same facts as the text, for ``--json``."""
    def verdict(v: Verdict) -> dict:
        return {"start": v.start.name.lower(), "line": v.line, "lost": list(v.lost)}

    return {
        "target": report.target.name,
        "kubevirt": {"found": report.kubevirt is not None, "release": report.before.release,
                     "assumed": report.before.assumed or None, "gates": sorted(report.before.gates),
                     "target_fits": report.release_fits, "gates_added": list(report.gates_added)},
        "plugins": [{"name": n, "pcitopo": ours} for n, ours in report.plugins],
        "plugins_after": list(report.after.plugins),
        "gpu_nodes": [{"name": n.name, "why": list(n.why), "daemonset": n.daemonset} for n in report.nodes],
        "workloads": [{"name": w.name, "kind": w.kind, "devices": list(w.devices), "opted_in": w.opted_in,
                       "before": verdict(w.before), "after": verdict(w.after), "harm": w.harm,
                       "doors": {"has": list(w.has), "needs": list(report.doors()) if w.opted_in else []}}
                      for w in report.workloads],
        "doors_needed": list(report.doors()),
        "sidecar_policy": [{"name": p.name, "kind": p.kind, "why": p.refusal.why, "certain": p.refusal.certain}
                           for p in report.policy],
        "harmed": [w.name for w in report.harmed] + [p.name for p in report.refused],
        "notes": list(report.notes),
        "ok": not report.fails,
    }
