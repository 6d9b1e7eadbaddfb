"""``pcitopo doctor``: is this host ready for GPUDirect RDMA in a VM?

A guest with a perfectly mirrored topology still runs NCCL far below bare metal when the host
is not ready: no IOMMU, a device not on ``vfio-pci``, a shared IOMMU group, ACS redirecting
ATS-translated peer traffic through the root complex, ATS off on the NIC, a link trained down,
no NUMA node, an unassigned BAR. Each check has a stable id (:data:`CHECKS`) and gives one
:class:`Finding` per device (``iommu`` once per host), with status ``ok | warn | fail | unknown``.
``unknown`` means the files could not answer (typically: config space beyond 64 bytes needs
root); it never fails anything. Facts and sources: docs/SOURCES.md, "Host readiness (doctor)".

Everything is read through the same sysfs source as the host model (a live ``/sys``, a capture,
a fixture), so a captured host can be doctored offline.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from pcitopo.checks.findings import CHECKS, STATUSES, DoctorReport, Finding, Fix, Target
from pcitopo.checks.kubeletcpu import read_kubelet
from pcitopo.errors import DoctorError, SysfsError
from pcitopo.host.configspace import ACS_CR, ACS_DT, ACS_RR, ATS_ENABLE, NEEDS_ROOT, ConfigSpace, ConfigUnknown, acs_flags
from pcitopo.host.sources import LEFT_OUT, PCI_DEVICES_DIR, Source, Unreadable, is_whole, resolve
from pcitopo.host.sysfs import IOMMU_CLASS_DIR, IOMMU_GROUPS_DIR
from pcitopo.model.keep import PerModel, Recent, recent
from pcitopo.model.labels import Labeled, default_devices, host_labels, label_devices
from pcitopo.model.tree import MELLANOX, Bdf, PciFunction, Role, Topology, is_bdf
from pcitopo.paths.classify import Nccl, classify

VFIO = "vfio-pci"
TRANSLATED_GROUP_TYPES = ("DMA", "DMA-FQ")
BAR_SLOTS = range(6)  # BAR0-5; the ROM and SR-IOV BARs are not the device's working BARs
_ROOT_FIX = Fix(first="run pcitopo doctor as root", after="config space past 64 bytes needs CAP_SYS_ADMIN")
DEVICES = "/sys/bus/pci/devices"
# Writing a device's address here makes the kernel probe it again (drivers/pci/pci-driver.c,
# drivers_probe_store): with driver_override set, only that driver may take it.
DRIVERS_PROBE = "/sys/bus/pci/drivers_probe"


# -- reading what the model does not hold -----------------------------------------------------

class HostFiles:
    """The doctor's reads, through the host model's own source."""

    def __init__(self, topo: Topology, source: Source):
        self.topo = topo
        self.source = source
        self._dirs: dict[Bdf, str] = {}
        # The sysfs reader remembers the links it followed; resolve through it when it is ours.
        loader = topo.loader
        self._links = loader if getattr(loader, "source", None) is source and hasattr(loader, "readlink") else source

    def dir_of(self, bdf: Bdf) -> str:
        if bdf not in self._dirs:
            self._dirs[bdf] = resolve(self._links, f"{PCI_DEVICES_DIR}/{bdf}")
        return self._dirs[bdf]

    def raw(self, bdf: Bdf, attr: str) -> bytes | Unreadable | None:
        return self.source.read(f"{self.dir_of(bdf)}/{attr}")

    def text(self, rel: str) -> str | None:
        data = self.source.read(rel)
        return data.decode("utf-8", "replace").strip() if isinstance(data, bytes) else None

    def config(self, bdf: Bdf) -> ConfigSpace:
        data = self.raw(bdf, "config")
        if data is None:
            raise ConfigUnknown("no config file")
        if isinstance(data, Unreadable):
            # Never "needs root" here: the kernel lets anyone read ``config`` and cuts it to 64
            # bytes without CAP_SYS_ADMIN (drivers/pci/pci-sysfs.c, pci_read_config); ConfigSpace
            # tells that case by its length. A file that cannot be read at all is something else.
            raise ConfigUnknown(f"config unreadable ({data.why})")
        return ConfigSpace(bytes(data))

    def driver_override(self, bdf: Bdf) -> str | None:
        text = self.text(f"{self.dir_of(bdf)}/driver_override")
        return None if not text or text == "(null)" else text

    def group_members(self, group: int) -> list[str] | None:
        return self.source.listdir(f"{IOMMU_GROUPS_DIR}/{group}/devices")

    def group_type(self, group: int) -> str | None:
        return self.text(f"{IOMMU_GROUPS_DIR}/{group}/type")

    def iommu_units(self) -> list[str] | None:
        return self.source.listdir(IOMMU_CLASS_DIR)


def host_source(topo: Topology) -> Source:
    """The sysfs source a host model reads from (the doctor reads more files there)."""
    source = getattr(topo.loader, "source", None)
    if source is None:
        raise SysfsError(f"{topo.name}: not read from sysfs; the doctor needs a sysfs tree")
    return source


# -- the checks ---------------------------------------------------------------------------------

def _f(check: str, status: str, t_bdf: Bdf | None, label: str | None, message: str, fix: Fix | None = None,
       kind: str | None = None) -> Finding:
    return Finding(check, status, str(t_bdf) if t_bdf is not None else None, message, fix.text() if fix is not None else None,
                   label, kind, remedy=fix)


_MODEL = object()  # check_vfio_driver: the driver the host model read


def rebind_fix(bdf: str, driver: str | None, in_group: bool) -> Fix:
    """Bind a device to vfio-pci from the state it is in: unbind only a device some driver
    holds (``driver/unbind`` exists only then); vfio-pci takes no device outside an IOMMU group,
    so with none the IOMMU comes first."""
    dev = f"{DEVICES}/{bdf}"
    unbind = f"echo {bdf} > {dev}/driver/unbind; " if driver else ""
    return Fix(run=f"echo {VFIO} > {dev}/driver_override; {unbind}echo {bdf} > {DRIVERS_PROBE}",
               setup=f"modprobe {VFIO}", first="" if in_group else "once the IOMMU is on (see iommu)")


def check_vfio_driver(files: HostFiles, t: Target, driver: object = _MODEL) -> Finding:
    """``driver``: the device's driver as read afresh (the hook's rebind check); by default the
    model's."""
    f = t.function
    held_by = f.driver if driver is _MODEL else driver
    override = files.driver_override(f.bdf)
    bdf = str(f.bdf)
    if held_by == VFIO:
        return _f("vfio-driver", "ok", f.bdf, t.label, f"bound to {VFIO}")
    if override == VFIO:
        if held_by is None:
            return _f("vfio-driver", "ok", f.bdf, t.label, f"unbound, driver_override={VFIO}: binds to {VFIO} on the next probe")
        return _f("vfio-driver", "warn", f.bdf, t.label,
                  f"driver_override says {VFIO} but {held_by} still holds it: KubeVirt cannot pass it through until it is rebound",
                  rebind_fix(bdf, held_by, f.iommu_group is not None),
                  f"held by {held_by} although driver_override is {VFIO}")
    held = f"bound to {held_by}" if held_by else "bound to no driver"
    if not t.must_be_vfio:
        return _f("vfio-driver", "ok", f.bdf, t.label,
                  f"{held}: a host NIC (no GPU at PXB or closer), not one for GPUDirect RDMA in a VM")
    if held_by is None and not is_whole(files.source):  # a copy may have left the link out
        return _f("vfio-driver", "unknown", f.bdf, t.label, f"no driver link: {LEFT_OUT['driver']}",
                  kind=f"with no driver link ({LEFT_OUT['driver']})")
    return _f("vfio-driver", "fail", f.bdf, t.label,
              f"{held}, not {VFIO}: KubeVirt passes only vfio-pci devices to a VM",
              rebind_fix(bdf, held_by, f.iommu_group is not None), f"{held}, not {VFIO}")


def check_iommu_group(files: HostFiles, t: Target, labels: dict[Bdf, str]) -> Finding:
    f = t.function
    if f.iommu_group is None and not is_whole(files.source):
        return _f("iommu-group", "unknown", f.bdf, t.label, f"no iommu_group link: {LEFT_OUT['iommu_group']}",
                  kind=f"with no iommu_group link ({LEFT_OUT['iommu_group']})")
    if f.iommu_group is None:
        return _f("iommu-group", "fail", f.bdf, t.label, "in no IOMMU group: VFIO cannot pass it through",
                  Fix(first="enable the IOMMU (see iommu)"), "in no IOMMU group (VFIO cannot pass them through)")
    members = files.group_members(f.iommu_group)
    if members is None:
        return _f("iommu-group", "unknown", f.bdf, t.label, f"members of IOMMU group {f.iommu_group} are not readable",
                  kind="IOMMU group members not readable")
    allowed = {a.bdf for a in files.topo.ancestry(f)}
    others = []
    for m in sorted(members):
        b = Bdf.parse(m) if is_bdf(m) else None
        if b is None or (b.device_key != f.bdf.device_key and b not in allowed):
            others.append(f"{m} ({labels[b]})" if b in labels else m)
    if not others:
        return _f("iommu-group", "ok", f.bdf, t.label, f"IOMMU group {f.iommu_group} holds only this device and bridges above it")
    return _f("iommu-group", "fail", f.bdf, t.label,
              f"IOMMU group {f.iommu_group} also holds {', '.join(others[:4])}{' ...' if len(others) > 4 else ''}: "
              "a group goes to one VM whole, so these devices cannot go to different VMs",
              Fix(first="enable ACS on the bridge above the devices (BIOS setting), or move a card; "
                        "never pcie_acs_override in production"),
              "sharing an IOMMU group with other devices (-v names them)")


def check_acs(files: HostFiles, bridge: PciFunction, label: str) -> Finding:
    try:
        ctrl = files.config(bridge.bdf).acs_control()
    except ConfigUnknown as e:
        return _f("acs", "unknown", bridge.bdf, label, f"ACS control unknown ({e.why})",
                  _ROOT_FIX if e.why == NEEDS_ROOT else None, f"with ACS control unknown ({e.why})")
    if ctrl is None:
        return _f("acs", "ok", bridge.bdf, label, "no ACS capability: nothing to set on this bridge")
    want = (ctrl | ACS_DT | ACS_RR | ACS_CR) & 0xFFFF
    # setpci names the ACS capability ECAP_ACS (pciutils); the check ran only where it exists
    fix = Fix(run=f"setpci -s {bridge.bdf} ECAP_ACS+0x6.w=0x{want:04x}", after="not persistent: reapply at every boot")
    shown = f"ACS control 0x{ctrl:02x} ({acs_flags(ctrl)})"
    if ctrl & (ACS_RR | ACS_CR) != ACS_RR | ACS_CR:
        return _f("acs", "fail", bridge.bdf, label,
                  f"{shown}: RR/CR cleared, so peer requests skip the IOMMU and the devices below merge into one IOMMU group",
                  fix, f"with ACS RR/CR cleared, 0x{ctrl:02x} (peer requests skip the IOMMU)")
    if not ctrl & ACS_DT:
        return _f("acs", "fail", bridge.bdf, label,
                  f"{shown}: Direct Translated P2P off, so ATS-translated GPU-NIC traffic still detours through the root complex "
                  "(GPUDirect RDMA far below bare metal)", fix,
                  f"with ACS Direct Translated P2P off, 0x{ctrl:02x} (GPU-NIC traffic detours through the root complex)")
    return _f("acs", "ok", bridge.bdf, label, f"{shown}: translated peer traffic goes direct, RR/CR kept")


def check_ats(files: HostFiles, t: Target) -> Finding:
    f = t.function
    bdf = f.bdf
    mlx = f.vendor == MELLANOX
    try:
        ctrl = files.config(bdf).ats_control()
    except ConfigUnknown as e:
        return _f("ats", "unknown", bdf, t.label, f"ATS state unknown ({e.why})", _ROOT_FIX if e.why == NEEDS_ROOT else None,
                  f"with ATS state unknown ({e.why})")
    if ctrl is None:
        why = "the firmware hides it (ATS_ENABLED=false)" if mlx else "the NIC does not offer it"
        # mlxconfig takes the PCI address for -d; -y answers its "Apply new configuration?" prompt
        fix = Fix(run=f"mlxconfig -y -d {bdf} set ATS_ENABLED=true", after="then reboot the host") if mlx else \
            Fix(first="enable ATS in the NIC's firmware")
        return _f("ats", "fail" if mlx else "warn", bdf, t.label,
                  f"no ATS capability, {why}: GPU-NIC peer traffic cannot go direct in a VM", fix, f"with no ATS capability ({why})")
    if ctrl & ATS_ENABLE:
        return _f("ats", "ok", bdf, t.label, "ATS enabled")
    # The capability is there, so the firmware offers ATS: what is left is the kernel's side.
    return _f("ats", "fail", bdf, t.label,
              "ATS capability present but disabled (ATSCtl Enable-): the IOMMU driver did not turn it on "
              "(identity/passthrough domain, or pci=noats); GPU-NIC traffic detours through the root complex",
              Fix(first="boot without pci=noats and without iommu=pt (a translated IOMMU domain)"),
              "with ATS present but disabled (ATSCtl Enable-)")


def _speed(text: str | None) -> float | None:
    try:
        return float(text.split()[0]) if text else None
    except ValueError:
        return None


def check_link(f: PciFunction, label: str, role: Role) -> Finding:
    ln = f.link
    cur_s, max_s = _speed(ln.current_speed), _speed(ln.max_speed)
    if cur_s is None or max_s is None or not ln.max_width or ln.current_width is None:
        return _f("link", "unknown", f.bdf, label, "link speed or width not readable", kind="with link speed or width not readable")
    shown = f"{ln.current_speed} x{ln.current_width}, capable of {ln.max_speed} x{ln.max_width}"
    fix = Fix(first="reseat the card or its cable/riser, check the slot's BIOS link settings, then check again")
    cut = "a fraction of the bandwidth NCCL counts on"
    if ln.current_width < ln.max_width:
        return _f("link", "fail", f.bdf, label, f"trained at {shown}: {cut}", fix, f"trained narrower than they can ({cut})")
    if cur_s < max_s:
        if role == Role.GPU:
            return _f("link", "warn", f.bdf, label,
                      f"trained at {shown}: GPUs lower their link speed when idle; check again under load", fix,
                      "trained slower than they can (GPUs lower their link speed when idle; check again under load)")
        return _f("link", "fail", f.bdf, label, f"trained at {shown}: {cut}", fix, f"trained slower than they can ({cut})")
    return _f("link", "ok", f.bdf, label, f"trained at {shown}")


def check_numa(topo: Topology, t: Target) -> Finding:
    f = t.function
    nodes = len(topo.numa_nodes())
    if nodes <= 1:
        return _f("numa", "ok", f.bdf, t.label, "single NUMA node host")
    if f.numa_node >= 0:
        return _f("numa", "ok", f.bdf, t.label, f"NUMA node {f.numa_node}")
    bios = "enable NUMA/proximity (ACPI _PXM) reporting in the BIOS"
    inherited = topo.numa_of(f)
    if inherited >= 0:
        # until then the node the bridge above has is the device's too: say so to the kernel
        return _f("numa", "warn", f.bdf, t.label, f"numa_node -1 on the device; node {inherited} taken from the bridge above",
                  Fix(run=f"echo {inherited} > {DEVICES}/{f.bdf}/numa_node", first=f"{bios}; meanwhile"),
                  "with numa_node -1, their node taken from the bridge above")
    return _f("numa", "fail", f.bdf, t.label,
              f"numa_node -1 on a {nodes}-node host: its expander bus cannot go on the right guest NUMA cell and NCCL picks "
              "CPUs and memory on the wrong socket", Fix(first=bios),
              f"with numa_node -1 on a {nodes}-node host, and none above (NCCL picks CPUs and memory on the wrong socket)")


def check_bar(topo: Topology, t: Target) -> Finding:
    f = t.function
    bars = f.bars  # the reader parsed ``resource`` already (src/pcitopo/model/bars.py); None: absent or bad
    if bars is None:
        # The reader said why in a warning on that file; without one, there was no file.
        tag = f"/{f.bdf}/resource: "
        why = next((w.split(tag, 1)[1].removesuffix(", ignored") for w in topo.warnings if tag in w), None)
        return _f("bar", "unknown", f.bdf, t.label, f"resource file not usable ({why})" if why else "resource file missing",
                  kind="with a resource file missing or not usable (BARs unknown)")
    bad = [b for b in bars if b.index in BAR_SLOTS and not b.assigned]
    if bad:
        what = ", ".join(f"BAR{b.index} ({_size(b.size)}{', 64-bit' if b.is_64bit else ''}"
                         f"{', prefetchable' if b.prefetchable else ''})" for b in bad)
        return _f("bar", "fail", f.bdf, t.label, f"{what} unassigned: the driver cannot map it, the device is unusable",
                  Fix(first="enable Above 4G Decoding / large MMIO in the BIOS, or boot with pci=realloc"),
                  "with BARs unassigned (the driver cannot map them: unusable)")
    used = sum(1 for b in bars if b.index in BAR_SLOTS and b.size)
    return _f("bar", "ok", f.bdf, t.label, f"{used} BAR{'s' if used != 1 else ''} assigned")


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def check_iommu(files: HostFiles, targets: Sequence[Target]) -> Finding:
    units = files.iommu_units() or []
    groups = sorted({t.function.iommu_group for t in targets if t.function.iommu_group is not None})
    fix = Fix(first="enable VT-d / AMD-Vi in the BIOS and boot with intel_iommu=on (AMD: on by default), without iommu=pt")
    if not units and not groups and not is_whole(files.source):
        return _f("iommu", "unknown", None, None, f"no IOMMU units and no IOMMU groups in {files.source.name}: "
                  f"{LEFT_OUT['iommu_group']} (not a live /sys)")
    if not units and not groups:
        return _f("iommu", "fail", None, None, "IOMMU off: no IOMMU units and no IOMMU groups; VFIO passthrough needs it", fix)
    types: dict[str, list[int]] = {}
    for g in groups:
        types.setdefault(files.group_type(g) or "?", []).append(g)
    where = f"{len(units)} IOMMU unit{'s' if len(units) != 1 else ''}" if units else "IOMMU groups present"
    if not groups:
        return _f("iommu", "ok", None, None, f"IOMMU on ({where}); none of the checked devices is in a group")
    shown = ", ".join(f"{t} ({len(gs)})" for t, gs in sorted(types.items()))
    if "identity" in types:
        return _f("iommu", "warn", None, None,
                  f"IOMMU on ({where}) but groups default to identity (iommu=pt): {shown}; the host does not translate "
                  "these devices' DMA and does not enable ATS for them until VFIO takes them", fix)
    if "?" in types or any(t not in TRANSLATED_GROUP_TYPES for t in types):
        return _f("iommu", "unknown", None, None, f"IOMMU on ({where}); group types not all readable or known: {shown}")
    return _f("iommu", "ok", None, None, f"IOMMU on ({where}), groups translated: {shown}")


# -- which devices ------------------------------------------------------------------------------

def _gdr_nics(topo: Topology, fs: Iterable[PciFunction]) -> set[Bdf]:
    """NICs with a GPU at PXB or closer (NCCL's view): the NICs GPUDirect RDMA would use."""
    fs = list(fs)
    gpus = [f for f in fs if topo.role(f) == Role.GPU]
    out = set()
    for n in fs:
        if topo.role(n) == Role.NIC and any(classify(topo, n, g).nccl in (Nccl.PIX, Nccl.PXB) for g in gpus):
            out.add(n.bdf)
    return out


def select_targets(topo: Topology, bdfs: Sequence[Bdf] | None) -> list[Target]:
    """GPUs and NICs (physical functions) by default; with BDFs, exactly those (every named
    device must be on vfio-pci). A NIC found by default must be on vfio-pci only when a GPU
    sits at PXB or closer to it (a host's storage or frontend NIC stays with its driver)."""
    named = bdfs is not None
    chosen = list(dict.fromkeys(topo.function(b).bdf for b in bdfs)) if named else default_devices(topo)
    labeled = label_devices(topo, chosen)
    host = host_labels(topo)
    # Named devices are all strict, so the pair classification is needed only for the default set.
    gdr = set() if named else _gdr_nics(topo, (lab.function for lab in labeled))
    return [Target(lab.function, host.get(lab.function.bdf) or _outside_label(lab), lab.role,
                   named or lab.role != Role.NIC or lab.function.bdf in gdr) for lab in labeled]




def _outside_label(lab: Labeled) -> str:
    """A named device outside the host's numbering (a VF, an NVMe drive, a switch-management
    function): its kind and BDF, which no numbered label can collide with."""
    return f"{lab.label.rstrip('0123456789')}@{lab.function.bdf}"


def path_bridges(topo: Topology, targets: Sequence[Target]) -> list[tuple[PciFunction, str, tuple[str, ...]]]:
    """Every bridge above a target, once, in address order, with its label (its role and the
    devices below it: ``downstream-port above GPU0``) and the labels of every target below it."""
    below: dict[Bdf, list[str]] = {}
    funcs: dict[Bdf, PciFunction] = {}
    for t in targets:
        for a in topo.ancestry(t.function):
            funcs[a.bdf] = a
            below.setdefault(a.bdf, []).append(t.label)
    return [(funcs[b], f"{topo.role(funcs[b]).value} above {','.join(below[b][:3])}{',...' if len(below[b]) > 3 else ''}",
             tuple(below[b])) for b in sorted(funcs)]


def run_checks(topo: Topology, bdfs: Sequence[Bdf] | None = None, source: Source | None = None,
               kubelet_dir: str | None = None, kubelet_config: str | None = None) -> DoctorReport:
    """Every check for the chosen devices and the bridges above them; ``iommu`` first. With
    ``kubelet_dir`` (the doctor runs on the node), the kubelet's CPU manager settings too."""
    files = HostFiles(topo, source if source is not None else host_source(topo))
    targets = select_targets(topo, bdfs)
    labels = {t.function.bdf: t.label for t in targets}
    out: list[Finding] = [check_iommu(files, targets)]
    for t in targets:
        out.append(check_vfio_driver(files, t))
        out.append(check_iommu_group(files, t, labels))
        if t.role == Role.NIC:
            out.append(check_ats(files, t))
        out.append(check_link(t.function, t.label, t.role))
        out.append(check_numa(topo, t))
        out.append(check_bar(topo, t))
    for bridge, label, above in path_bridges(topo, targets):
        out += [replace(check_acs(files, bridge, label), above=above), replace(check_link(bridge, label, topo.role(bridge)), above=above)]
    kubelet = read_kubelet(kubelet_dir, kubelet_config, topo.numa_nodes()) if kubelet_dir else None
    return DoctorReport(topo.name, tuple(out), tuple(targets), kubelet)


# -- the hook: once per allocation ----------------------------------------------------------------

# Allocations whose findings a model keeps: a sidecar serves one VM (one allocation); a few more
# cover a shared test server or a bench without letting memory grow.
KEPT_ALLOCATIONS = 8
# The findings per set of devices, for each host model (a new model starts with none).
FINDINGS: PerModel[Recent[tuple[Bdf, ...], DoctorReport]] = recent(KEPT_ALLOCATIONS)


def allocation_checks(topo: Topology, bdfs: Sequence[Bdf], recheck_drivers: bool = True) -> DoctorReport:
    """The checks for one VM's devices as the hook runs them at every define of a boot: computed
    once per model and allocation (:data:`FINDINGS`, like the other per-allocation work,
    src/pcitopo/model/keep.py), so config space, IOMMU groups, links and BARs are read once. What can
    change between the defines of one boot is a rebind: each device's ``driver`` link is read
    again at every call, and a device whose driver is not the one its findings were made with is
    checked again (with its ``driver_override``). ``recheck_drivers`` False: the caller has just
    compared these devices' driver links with the model (``pcitopo.host.freshness``)."""
    kept = FINDINGS(topo).get(tuple(bdfs), lambda: run_checks(topo, bdfs))
    source = getattr(topo.loader, "source", None)
    if source is None or not recheck_drivers:  # a model built in memory: nothing can be rebound under it
        return kept
    files = HostFiles(topo, source)
    fresh: dict[str, Finding] = {}
    for t in kept.targets:
        driver = _link_name(source.readlink(f"{files.dir_of(t.function.bdf)}/driver"))
        if driver != t.function.driver:
            fresh[str(t.function.bdf)] = check_vfio_driver(files, t, driver)
    if not fresh:
        return kept
    rechecked = (fresh.get(f.bdf, f) if f.check == "vfio-driver" and f.bdf is not None else f for f in kept.findings)
    return replace(kept, findings=tuple(rechecked))


def _link_name(target: str | None) -> str | None:
    return target.rstrip("/").rsplit("/", 1)[-1] if target else None


__all__ = ["CHECKS", "STATUSES", "DoctorError", "DoctorReport", "Finding", "Fix", "HostFiles", "Target",
           "allocation_checks", "rebind_fix", "run_checks", "select_targets"]
