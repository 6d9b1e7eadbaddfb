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

from ..errors import ConfigError, PcitopoError
from ..model.tree import Bdf, Role, Topology
from ..paths.classify import classify

MAX_EXPECT_BYTES = 16 * 1024 * 1024
CLASSES = ("PIX", "PXB", "PHB", "NODE", "SYS")


@dataclass(frozen=True)
class ExpectedDevice:
    host_bdf: Bdf
    guest_bdf: Bdf | None
    kind: str
    label: str
    numa: int


@dataclass(frozen=True)
class ExpectedPair:
    a: Bdf
    b: Bdf
    nccl: str | None
    nvml: str | None


@dataclass(frozen=True)
class Expectation:
    devices: tuple[ExpectedDevice, ...]
    pairs: tuple[ExpectedPair, ...]


@dataclass
class Verification:
    problems: list[str] = field(default_factory=list)
    devices_checked: int = 0
    pairs_checked: int = 0


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
        ))
    out_pairs = []
    for i, p in enumerate(pairs):
        w = f"{name}: pairs[{i}]"
        out_pairs.append(ExpectedPair(
            _bdf(_field(p, "a", w, (str,)), f"{w}.a"), _bdf(_field(p, "b", w, (str,)), f"{w}.b"),  # type: ignore[arg-type]
            _class(_field(p, "nccl", w, (str,), optional=True), f"{w}.nccl"),
            _class(_field(p, "nvml", w, (str,), optional=True), f"{w}.nvml"),
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
        v.problems.append(f"{who}: the prediction gives it no guest address")
        return False
    try:
        f = guest.function(d.guest_bdf)
    except PcitopoError:
        v.problems.append(f"{who}: predicted at guest {d.guest_bdf}, the guest has no such device")
        return False
    v.devices_checked += 1
    role = guest.role(f).value
    if role != d.kind:
        v.problems.append(f"{who}: predicted {_a(d.kind)} at guest {d.guest_bdf}, the guest has {_a(role)} ({f.ids}) there")
        return False
    if f.numa_node != d.numa:
        v.problems.append(f"{who} at guest {d.guest_bdf}: numa_node {f.numa_node}, predicted {d.numa}")
    return True


def verify_guest(expect: Expectation, guest: Topology) -> Verification:
    """Every difference between the guest and the prediction, one line each."""
    v = Verification()
    ok = {d.host_bdf: d for d in expect.devices if _check_device(guest, d, v)}
    for p in expect.pairs:
        da, db = ok.get(p.a), ok.get(p.b)
        if da is None or db is None:
            continue  # the device is reported above
        where = f"{da.label}-{db.label} (host {p.a}-{p.b}, guest {da.guest_bdf}-{db.guest_bdf})"
        try:
            got = classify(guest, da.guest_bdf, db.guest_bdf)  # type: ignore[arg-type]
        except PcitopoError as e:
            v.problems.append(f"{where}: cannot classify it in the guest: {e}")
            continue
        v.pairs_checked += 1
        for view, want, have in (("NCCL", p.nccl, got.nccl.value), ("nvidia-smi", p.nvml, got.nvml.value)):
            if want is not None and want != have:
                v.problems.append(f"{where}: {view} {have}, predicted {want}")
    return v
