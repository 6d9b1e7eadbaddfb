"""``pcitopo preflight``: what applying a deploy target would do to a cluster, read from its dump.

Every VM and VMI with a PCI host device is judged twice by the start model (src/pcitopo/kubevirt/starts.py):
on the cluster as dumped, and on the cluster with the target's gates and Plugin objects added.
A VM that started and would not, or that had every pcitopo setting and would lose some, is
harmed, by name. The GPU nodes, and whether the DaemonSets land on them, are src/pcitopo/kubevirt/nodes.py's
rule (a GPU resource or a GPU label; SR-IOV NICs are not GPUs).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pcitopo.errors import ConfigError
from pcitopo.kubevirt.admitted import Admitted, in_dump, judged
from pcitopo.kubevirt.cluster import ClusterDump, mapping, name_of
from pcitopo.kubevirt.doors import PCITOPO_PLUGIN
from pcitopo.kubevirt.nodes import GpuNode, gpu_node, gpu_resources
from pcitopo.kubevirt.releases import ReleaseUnknown
from pcitopo.kubevirt.sidecar_policy import Refusal, refusal
from pcitopo.kubevirt.starts import Cluster, Start, Verdict, cluster_of, doors_needed, judge, opted_in, pci_devices
from pcitopo.kubevirt.targets import Target

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
    before: Cluster | None  # None: the release is unknown
    after: Cluster | None
    release_fits: bool | None  # None: no release to judge
    gates_added: tuple[str, ...]
    plugins: tuple[tuple[str, bool], ...]  # (name, pcitopo's), as dumped
    nodes: list[GpuNode] = field(default_factory=list)
    workloads: list[Workload] = field(default_factory=list)
    policy: list[PolicyHarm] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unknown: str = ""  # why nothing was judged: no KubeVirt CR, or a release pcitopo did not read
    seen: str | None = None  # the release as the dump gives it
    admitted: Admitted = field(default_factory=Admitted)  # what the target's Sidecar policy will admit
    on_pcitopo: dict[str, list[str]] = field(default_factory=dict)  # pcitopo image -> the VMs whose hook runs it
    sidecar_open: str | None = None  # the Sidecar gate is on and nothing restricts hook sidecars: why, what closes it

    @property
    def harmed(self) -> list[Workload]:
        return [w for w in self.workloads if w.harm]

    @property
    def refused(self) -> list[PolicyHarm]:
        """The Sidecar policy surely refuses these (the others hinge on what the dump lacks)."""
        return [p for p in self.policy if p.refusal.certain]

    @property
    def fails(self) -> bool:
        return not self.unknown and (bool(self.harmed) or bool(self.refused) or self.release_fits is False
                                     or bool(self.sidecar_open))

    def doors(self) -> tuple[str, ...]:
        return doors_needed(self.after) if self.after is not None else ()


def preflight(dump: ClusterDump, tgt: Target, image: str | None = None, assume: str | None = None, *,
              images: tuple[str, ...] = (), allow: tuple[str, ...] = (), components: tuple[str, ...] = ()) -> Preflight:
    """``image``, then ``images``: the pcitopo image the user pins in the target's PodTemplate,
    then earlier ones it still admits (none: the dump's params say, or not known); ``assume``:
    ``--assume-release``, the read release to judge the dump's as; ``allow``: ``--allow-sidecar``
    entries, as if the params admitted them (src/pcitopo/kubevirt/admitted.py); ``components``: the optional
    components the overlay adds (``hook-sidecars-policy``). Without a KubeVirt CR, or on a release
    pcitopo did not read, nothing is judged: :attr:`Preflight.unknown` says why."""
    from pcitopo.kubevirt.releases import check_assumed

    admitted = judged(in_dump(dump), ((image,) if image else ()) + tuple(images), allow)
    cr = dump.kubevirt
    assume = check_assumed(assume) if assume else None
    seen = cr.version if cr is not None else None
    resources = gpu_resources({p.resource: p.vendor_device for p in cr.permitted_pci} if cr else {})
    nodes = [n for n in (gpu_node(node, resources) for node in dump.nodes) if n is not None]
    plugins = tuple((name_of(p), name_of(p) == PCITOPO_PLUGIN) for p in dump.plugins)
    if cr is None:
        return Preflight(tgt, None, None, None, None, (), plugins, nodes, unknown=(
            "the dump has no KubeVirt CR: its release, gates and permitted host devices are unknown; dump "
            "`kubectl get kubevirt,plugins.plugin.kubevirt.io,namespaces,nodes,vmis,vms -A -o yaml` to judge for real"))
    try:
        before = cluster_of(dump, None, assume)
        before = before if before is None else replace(before, pcitopo_images=admitted.pcitopo,
                                                       permitted=cr.permitted)  # a name the CR does not permit: no pod
    except ReleaseUnknown as e:
        notes = [_newer_main_note()] if e.newer_main else []
        return Preflight(tgt, cr.name, None, None, None, (), plugins, nodes, notes=notes, unknown=e.line, seen=seen)
    if before is None:
        return Preflight(tgt, cr.name, None, None, None, (), plugins, nodes, seen=seen, unknown=(
            f"the KubeVirt CR {cr.name} has no status.observedKubeVirtVersion: name its release with --assume-release"))
    after = before.with_target(tgt)
    notes = [before.assumed] if before.assumed else []
    if before.release == assume and assume.startswith("main") and not (seen and _is_read_main(seen)):
        notes.append(_newer_main_note())
    report = Preflight(tgt, cr.name, before, after, tgt.fits(before.release),
                       tuple(g for g in tgt.gates if g not in before.gates), plugins, nodes, notes=notes, seen=seen)
    report.workloads = _workloads(dump, before, after)
    report.admitted = admitted
    policy = tgt.sidecar_policy or SIDECAR_POLICY_COMPONENT.rsplit("/", 1)[1] in components
    report.policy = _policy_harms(dump, admitted) if policy else []
    report.on_pcitopo = _on_pcitopo(dump, admitted) if policy else {}
    report.sidecar_open = None if policy else _sidecar_open(dump, tgt, before)
    report.notes += _foreign_plugin_notes(report)
    return report


def _is_read_main(version: str) -> bool:
    from pcitopo.kubevirt.releases import resolve

    try:
        return resolve(version).name.startswith("main")
    except ReleaseUnknown:
        return False


def _newer_main_note() -> str:
    from pcitopo.kubevirt.releases import MAIN_COMMIT, MAIN_DATE, NEXT_PLUGIN_API, PLUGIN_API

    return (f"pcitopo read KubeVirt main's Plugin API ({PLUGIN_API}) at {MAIN_COMMIT} ({MAIN_DATE}); it cannot "
            f"tell whether this build's Plugin API still has domainHooks: {NEXT_PLUGIN_API}. A Plugin object "
            "written with domainHooks may not work after that change")


def _workloads(dump: ClusterDump, before: Cluster, after: Cluster) -> list[Workload]:
    """Each VM (the VMI it starts) and each VMI without a VM of its name, with a PCI host device."""
    from pcitopo.kubevirt.doors import plugin_selects
    from pcitopo.kubevirt.manifest import as_vmi, hook_sidecar_attachment

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
        has = tuple(d for d, yes in (("hook", hook_sidecar_attachment(mapping(meta.get("annotations")),
                                                                      before.pcitopo_images).attached),
                                     ("plugin", plugin_selects(dict(mapping(meta.get("labels")))))) if yes)
        out.append(Workload(name, str(obj.get("kind")), tuple(devices), opted_in(vmi, before.pcitopo_images), judge(vmi, before),
                            judge(vmi, after), has))
    return out


def _hooked(dump: ClusterDump) -> list[tuple[dict, str, str, Any]]:
    """Every VM (its template) and lone VMI with hooks.kubevirt.io/hookSidecars: the object, its
    name, its namespace and the annotation's value (what starts next)."""
    from pcitopo.kubevirt.manifest import HOOK_SIDECARS, as_vmi

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
        if HOOK_SIDECARS in annotations:
            out.append((obj, name, str(meta.get("namespace")), annotations[HOOK_SIDECARS]))
    return out


def _namespace_labels(dump: ClusterDump) -> dict[str, dict]:
    return {name_of(o): dict(mapping(mapping(o.get("metadata")).get("labels"))) for o in dump.of_kind("Namespace")}


def vmi_policy_refusal(vmi: Mapping[str, Any], dump: ClusterDump | None, tgt: Target | None,
                       images: tuple[str, ...] = ()) -> Refusal | None:
    """``xmlfix --check``: the Sidecar policy on one VMI, as preflight judges every VM. Judged
    when ``tgt`` carries the policy, or, without a target, when the dump holds pcitopo's params
    with the Sidecar gate on (the hook targets are what turn it on); None when not judged or
    admitted."""
    from pcitopo.kubevirt.manifest import HOOK_SIDECARS

    params = in_dump(dump) if dump is not None else None
    gate = dump is not None and dump.kubevirt is not None and "Sidecar" in dump.kubevirt.gates
    if not (tgt.sidecar_policy if tgt is not None else params is not None and gate):
        return None
    meta = mapping(vmi.get("metadata"))
    annotations = mapping(meta.get("annotations"))
    if HOOK_SIDECARS not in annotations:
        return None
    namespace = str(meta.get("namespace") or "")
    labels = _namespace_labels(dump).get(namespace) if dump is not None and namespace else None
    return refusal(annotations[HOOK_SIDECARS], namespace or "(no namespace)", labels, judged(params, images))


def _policy_harms(dump: ClusterDump, admitted: Admitted) -> list[PolicyHarm]:
    """Every VM and lone VMI with hooks.kubevirt.io/hookSidecars that the target's Sidecar policy
    would refuse at its next start, with or without PCI devices."""
    namespaces = _namespace_labels(dump)
    out = []
    for obj, name, namespace, value in _hooked(dump):
        why = refusal(value, namespace, namespaces.get(namespace), admitted)
        if why is not None:
            out.append(PolicyHarm(name, str(obj.get("kind")), why))
    return out


def _on_pcitopo(dump: ClusterDump, admitted: Admitted) -> dict[str, list[str]]:
    """Each pcitopo image the policies admit, and the VMs whose hook sidecar runs it: an upgrade
    drops an earlier one only when no VM uses it."""
    out: dict[str, list[str]] = {image: [] for image in admitted.pcitopo}
    for _, name, _, value in _hooked(dump):
        try:
            entries = json.loads(value) if isinstance(value, str) else []
        except ValueError:
            continue
        for image in {e.get("image") for e in entries if isinstance(entries, list) and isinstance(e, dict)}:
            if image in out:
                out[image].append(name)
    return out


SIDECAR_POLICY_COMPONENT = "deploy/components/hook-sidecars-policy"
SIDECAR_POLICIES = ("pcitopo-hook-sidecars", "pcitopo-hook-sidecars-image")


def _sidecar_open(dump: ClusterDump, tgt: Target, before) -> str | None:
    """A target without the Sidecar policy on a cluster whose `Sidecar` gate is on: every VM
    owner can run any image, command or script as a hook sidecar in its virt-launcher pod."""
    if tgt.sidecar_policy or "Sidecar" not in before.gates:
        return None
    present = {name_of(o) for o in dump.of_kind("ValidatingAdmissionPolicy")}
    if all(p in present for p in SIDECAR_POLICIES):
        return None
    return (f"the KubeVirt gate Sidecar is on and {tgt.name} renders no Sidecar policy: any tenant can run any image, "
            f"command or script as a hook sidecar in its VMs' virt-launcher pods; add the component "
            f"{SIDECAR_POLICY_COMPONENT} to your overlay and judge with --component hook-sidecars-policy (once "
            "applied, its policies show in `kubectl get validatingadmissionpolicies -o yaml`), or turn Sidecar off")


def _foreign_plugin_notes(report: Preflight) -> list[str]:
    """Another vendor's Plugin object on a v1.9.x cluster: what is broken already, what pcitopo does."""
    foreign = [name for name, ours in report.plugins if not ours]
    if not (foreign and report.before.pipeline_runs and not report.before.writes_mode):
        return []
    broken = [w.name for w in report.workloads if not w.before.starts and "kubevirt#18861" in w.before.cause]
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

    b, a = report.before, report.after
    return {
        "target": report.target.name,
        "kubevirt": {"found": report.kubevirt is not None, "release": b.release if b else report.seen,
                     "assumed": (b.assumed or None) if b else None, "gates": sorted(b.gates) if b else [],
                     "target_fits": report.release_fits, "gates_added": list(report.gates_added)},
        "plugins": [{"name": n, "pcitopo": ours} for n, ours in report.plugins],
        "plugins_after": list(a.plugins) if a else [],
        "gpu_nodes": [{"name": n.name, "why": list(n.why), "daemonset": n.daemonset} for n in report.nodes],
        "workloads": [{"name": w.name, "kind": w.kind, "devices": list(w.devices), "opted_in": w.opted_in,
                       "before": verdict(w.before), "after": verdict(w.after), "harm": w.harm,
                       "doors": {"has": list(w.has), "needs": list(report.doors()) if w.opted_in else []}}
                      for w in report.workloads],
        "doors_needed": list(report.doors()),
        "sidecar_policy": [{"name": p.name, "kind": p.kind, "why": p.refusal.why, "certain": p.refusal.certain,
                            "admit": p.refusal.admit} for p in report.policy],
        "admitted": {"pcitopo": [{"image": i, "pinned": n == 0, "vms": report.on_pcitopo.get(i, [])}
                                 for n, i in enumerate(report.admitted.pcitopo)],
                     "sidecars": sorted(report.admitted.sidecars),
                     "configmaps": sorted(f"{ns}/{name}" for ns, name in report.admitted.configmaps)},
        "sidecar_open": report.sidecar_open,
        "harmed": [w.name for w in report.harmed] + [p.name for p in report.refused],
        "notes": list(report.notes),
        "unknown": report.unknown or None,
        "ok": not report.fails and not report.unknown,
    }
