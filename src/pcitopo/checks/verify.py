"""``pcitopo verify``: inside the guest, compare what the guest really has with what
``xmlfix --json`` predicted, device by device and pair by pair.

The prediction names every device by its host BDF and says where the guest will have it
(``guest_bdf``), what it is (``kind``) and which NUMA node the guest shows (``numa``, -1 for
none); every pair's predicted NCCL and nvidia-smi classes follow. The guest's own sysfs is read
with the same reader and classified with the same classifier as the host, so a difference is a
real difference of the guest's PCI tree. NVLink is not in sysfs: ``nvlink`` is carried for
people and ``nvidia-smi topo -m`` (see docs/GUEST.md), not checked here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pcitopo.errors import ConfigError, PcitopoError
from pcitopo.model.tree import Bdf, Role, Topology
from pcitopo.nccl.pcitree import NcclTree
from pcitopo.nccl.price import nccl_tree
from pcitopo.nccl.topoxml import XmlNode
from pcitopo.paths.classify import classify

MAX_EXPECT_BYTES = 16 * 1024 * 1024
CLASSES = ("PIX", "PXB", "PHB", "NODE", "SYS")


@dataclass(frozen=True)
class ExpectedDevice:
    host_bdf: Bdf
    guest_bdf: Bdf | None
    kind: str
    label: str
    numa: int
    nccl_cpu_gbps: float | None = None  # NCCL's bandwidth to its CPU on the host (GPUs)


@dataclass(frozen=True)
class ExpectedPair:
    a: Bdf
    b: Bdf
    nccl: str | None
    nvml: str | None
    nccl_gbps: float | None = None  # NCCL's bandwidth of the path on the host (GPU–GPU, GPU–NIC)


@dataclass(frozen=True)
class Expectation:
    devices: tuple[ExpectedDevice, ...]
    pairs: tuple[ExpectedPair, ...]


@dataclass
class Verification:
    problems: list[str] = field(default_factory=list)
    devices_checked: int = 0
    pairs_checked: int = 0
    bandwidths_checked: int = 0
    bandwidths_equal: int = 0
    # host BDFs of the devices, and host BDF pairs, that are not as predicted (a pair with a
    # device that is not is not checked: it is in neither set)
    bad_devices: set = field(default_factory=set)
    bad_pairs: set = field(default_factory=set)
    pairs_unchecked: int = 0


_TYPE_NAMES = {str: "a string", int: "a number", list: "a list"}


def _field(obj: object, key: str, where: str, types: tuple[type, ...], optional: bool = False):
    if not isinstance(obj, dict) or key not in obj:
        raise ConfigError(f"{where}.{key} is missing")
    v = obj[key]
    if v is None and optional:
        return None
    if not isinstance(v, types) or isinstance(v, bool):
        raise ConfigError(f"{where}.{key} is {json.dumps(v)[:40]}, not {_TYPE_NAMES.get(types[0], types[0].__name__)}")
    return v


def _bdf(text: str | None, where: str) -> Bdf | None:
    if text is None:
        return None
    try:
        return Bdf.parse(text)
    except PcitopoError:
        raise ConfigError(f"{where}: {text[:40]!r} is not a PCI address") from None


def _gbps(obj: dict, key: str, where: str) -> float | None:
    """An optional bandwidth (a prediction from before bandwidths has none)."""
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise ConfigError(f"{where}.{key} is {json.dumps(v)[:40]}, not a bandwidth in GB/s")
    return float(v)


def _class(v: str | None, where: str) -> str | None:
    if v is not None and v not in CLASSES:
        raise ConfigError(f"{where} is {v[:20]!r}, not one of {'/'.join(CLASSES)}")
    return v


def load_expectation(data: bytes, name: str) -> Expectation:
    """Parse ``xmlfix --json`` output; a bad file is a ConfigError naming the field."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{name}: not JSON as xmlfix --json writes it ({e})") from None
    devs = _field(doc, "devices", name, (list,))
    pairs = _field(doc, "pairs", name, (list,))
    devices = []
    for i, d in enumerate(devs):
        w = f"{name}: devices[{i}]"
        devices.append(ExpectedDevice(
            _bdf(_field(d, "host_bdf", w, (str,)), f"{w}.host_bdf"),  # type: ignore[arg-type]
            _bdf(_field(d, "guest_bdf", w, (str,), optional=True), f"{w}.guest_bdf"),
            _field(d, "kind", w, (str,)), _field(d, "label", w, (str,)), _field(d, "numa", w, (int,)),
            _gbps(d, "nccl_cpu_gbps", w),
        ))
    out_pairs = []
    for i, p in enumerate(pairs):
        w = f"{name}: pairs[{i}]"
        out_pairs.append(ExpectedPair(
            _bdf(_field(p, "a", w, (str,)), f"{w}.a"), _bdf(_field(p, "b", w, (str,)), f"{w}.b"),  # type: ignore[arg-type]
            _class(_field(p, "nccl", w, (str,), optional=True), f"{w}.nccl"),
            _class(_field(p, "nvml", w, (str,), optional=True), f"{w}.nvml"),
            _gbps(p, "nccl_gbps", w),
        ))
    known = {d.host_bdf for d in devices}
    for i, p in enumerate(out_pairs):
        for end in (p.a, p.b):
            if end not in known:
                raise ConfigError(f"{name}: pairs[{i}] names {end}, which is not among the devices")
    return Expectation(tuple(devices), tuple(out_pairs))


def _a(kind: str) -> str:
    """A role's value with its article: "a gpu", "an upstream-port", "an unclassified device"."""
    if kind == Role.OTHER.value:
        return "an unclassified device"
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def _check_device(guest: Topology, d: ExpectedDevice, v: Verification) -> bool:
    who = f"{d.label} (host {d.host_bdf})"
    if d.guest_bdf is None:
        return _bad_device(v, d, f"{who}: the prediction gives it no guest address")
    try:
        f = guest.function(d.guest_bdf)
    except PcitopoError:
        return _bad_device(v, d, f"{who}: predicted at guest {d.guest_bdf}, the guest has no such device")
    v.devices_checked += 1
    role = guest.role(f).value
    if role != d.kind:
        return _bad_device(v, d, f"{who}: predicted {_a(d.kind)} at guest {d.guest_bdf}, the guest has {_a(role)} ({f.ids}) there")
    if f.numa_node != d.numa:
        _bad_device(v, d, f"{who} at guest {d.guest_bdf}: numa_node {f.numa_node}, predicted {d.numa}")
    return True


def _bad_device(v: Verification, d: ExpectedDevice, problem: str) -> bool:
    v.problems.append(problem)
    v.bad_devices.add(d.host_bdf)
    return False


def verify_guest(expect: Expectation, guest: Topology, nccl_system: XmlNode | None = None) -> Verification:
    """Every difference between the guest and the prediction, one line each. ``nccl_system``:
    the NCCL topology file installed in the guest (parsed), which NCCL reads over sysfs."""
    v = Verification()
    ok = {d.host_bdf: d for d in expect.devices if _check_device(guest, d, v)}
    _check_bandwidths(expect, guest, ok, nccl_tree(guest, nccl_system), v)
    for p in expect.pairs:
        da, db = ok.get(p.a), ok.get(p.b)
        if da is None or db is None:
            v.pairs_unchecked += 1
            continue  # the device is reported above
        where = f"{da.label}-{db.label} (host {p.a}-{p.b}, guest {da.guest_bdf}-{db.guest_bdf})"
        try:
            got = classify(guest, da.guest_bdf, db.guest_bdf)  # type: ignore[arg-type]
        except PcitopoError as e:
            v.problems.append(f"{where}: cannot classify it in the guest: {e}")
            v.bad_pairs.add((p.a, p.b))
            continue
        v.pairs_checked += 1
        for view, want, have in (("NCCL", p.nccl, got.nccl.value), ("nvidia-smi", p.nvml, got.nvml.value)):
            if want is not None and want != have:
                v.problems.append(f"{where}: {view} {have}, predicted {want}")
                v.bad_pairs.add((p.a, p.b))
    return v


def _check_bandwidths(expect: Expectation, guest: Topology, ok: dict[Bdf, ExpectedDevice], tree: NcclTree,
                      v: Verification) -> None:
    """NCCL's bandwidth of every GPU path the prediction prices, computed NCCL's way in the
    guest, against the host's."""

    def busid(d: ExpectedDevice) -> str:
        g = d.guest_bdf
        return str(g.with_function(0) if d.kind == Role.NIC.value else g)  # type: ignore[union-attr]

    def compare(where: str, got: float, want: float) -> None:
        v.bandwidths_checked += 1
        if round(got, 4) != round(want, 4):
            v.problems.append(f"{where}: NCCL bandwidth {got:g} GB/s in the guest, host {want:g} GB/s")
        else:
            v.bandwidths_equal += 1

    for d in ok.values():
        if d.nccl_cpu_gbps is not None:
            compare(f"{d.label}-CPU (host {d.host_bdf}, guest {d.guest_bdf})", tree.to_cpu(busid(d)), d.nccl_cpu_gbps)
    for p in expect.pairs:
        da, db = ok.get(p.a), ok.get(p.b)
        if p.nccl_gbps is not None and da is not None and db is not None:
            where = f"{da.label}-{db.label} (host {p.a}-{p.b}, guest {da.guest_bdf}-{db.guest_bdf})"
            compare(where, tree.between(busid(da), busid(db)), p.nccl_gbps)
