"""``.topo`` text → :class:`HostSpec`: line by line, then the whole-description checks (NUMA
nodes exist, bus ranges nest like a real bus scan). Every refusal is a :class:`TopoError`
naming the line."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from pcitopo.errors import PcitopoError
from pcitopo.libvirt.domain import parse_cpuset
from pcitopo.model.tree import BDF_RE, Bdf
from pcitopo.synth import doctorfiles as synth_doctor
from pcitopo.synth.looks import LINK_FILES, OMITTABLE, PRESETS, SPEEDS, WIDTHS, Look
from pcitopo.synth.spec import BRIDGE_KINDS, KINDS, PARENTS, DeviceSpec, HostSpec, NumaSpec, RootSpec, TopoError

_HEX = r"[0-9a-fA-F]"
_RC_RE = re.compile(rf"^({_HEX}{{4}}):({_HEX}{{2}})$")
_IDS_RE = re.compile(rf"^({_HEX}{{4}}):({_HEX}{{4}})$")

_DEVICE_KEYS = {"preset", "ids", "sub", "class", "numa", "speed", "width", "cur-speed", "cur-width",
                "driver", "iommu", "omit",
                "fault", "override", "iommu-type"}  # the last three: pcitopo doctor (synth/doctor.py)
_EP_KEYS = _DEVICE_KEYS | {"functions", "vfs", "rdma"}
_RDMA_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def _written_in_full(m: re.Match) -> bool:
    """A .topo address is written as lspci prints it: two-digit bus and device, and a domain, if
    given, of four digits (the model's pattern also takes shorter fields)."""
    dom, bus, slot, _ = m.groups()
    return len(bus) == 2 and len(slot) == 2 and (dom is None or len(dom) == 4)


class _Parser:
    def __init__(self, text: str, name: str):
        self.text = text
        self.name = name
        self.numa: list[NumaSpec] = []
        self.roots: list[RootSpec] = []
        self.lineno = 0
        # (indent, node, indent its children use or None) for the open lines, outermost first
        self.stack: list[tuple[int, RootSpec | DeviceSpec, int | None]] = []
        self.seen: dict[Bdf, tuple[int, str]] = {}  # every function and VF → (line, what)
        self.secondary: dict[int, int] = {}  # id(bridge) → its secondary bus (from its first child)
        self.address_bits: tuple[int, int] | None = None

    def fail(self, reason: str, line: int | None = None) -> TopoError:
        return TopoError(self.name, line if line is not None else self.lineno, reason)

    def parse(self) -> HostSpec:
        # The parser's own line counter, so fail() names the line being read.
        for self.lineno, raw in enumerate(self.text.splitlines(), 1):  # noqa: B020
            body = raw.split("#", 1)[0].rstrip()
            if not body.strip():
                continue
            stripped = body.lstrip(" ")
            if stripped.startswith("\t") or "\t" in body[: len(body) - len(stripped)]:
                raise self.fail("indent with spaces, not tabs")
            self.line(len(body) - len(stripped), stripped.split())
        if not self.numa:
            raise self.fail("no 'numa' line: every host has at least node 0", 1)
        spec = HostSpec(self.name, self.numa, self.roots, self.address_bits)
        _check(spec, self)
        return spec

    def line(self, indent: int, tokens: list[str]) -> None:
        head = tokens[0]
        if head == "cpu":
            if indent:
                raise self.fail("'cpu' lines are not indented")
            return self.cpu_line(tokens)
        if head not in KINDS and head != "numa":
            raise self.fail(f"unknown line kind {head!r} (want cpu, numa, {', '.join(KINDS)})")
        if len(tokens) < 2:
            raise self.fail(f"{head} needs an address")
        if head in ("numa", "rc"):
            if indent:
                raise self.fail(f"'{head}' lines are not indented")
            self.stack = []
            if head == "numa":
                self.numa_line(tokens)
            else:
                self.rc_line(tokens)
            return
        while self.stack and self.stack[-1][0] >= indent:
            self.stack.pop()
        if not self.stack:
            raise self.fail(f"{head} {tokens[1]} must be indented below an rc or a bridge")
        top_indent, parent, child_indent = self.stack[-1]
        if child_indent is not None and child_indent != indent:
            raise self.fail("indentation does not line up with the lines above")
        self.stack[-1] = (top_indent, parent, indent)
        dev = self.device_line(head, tokens, parent)
        parent.children.append(dev)
        self.stack.append((indent, dev, None))

    def keyvals(self, tokens: list[str], allowed: set[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for tok in tokens:
            key, eq, value = tok.partition("=")
            if not eq or not value:
                raise self.fail(f"expected key=value, got {tok!r}")
            if key not in allowed:
                raise self.fail(f"unknown key {key!r} (want one of {', '.join(sorted(allowed))})")
            if key in out:
                raise self.fail(f"{key}= given twice")
            out[key] = value
        return out

    def int_value(self, key: str, value: str, lo: int, hi: int, base: int = 10) -> int:
        try:
            n = int(value, base)
        except ValueError:
            raise self.fail(f"{key}={value!r} is not a number") from None
        if not lo <= n <= hi:
            raise self.fail(f"{key}={value} is out of range {lo}..{hi}")
        return n

    def cpu_line(self, tokens: list[str]) -> None:
        """``cpu phys-bits=52 [virt-bits=57]``: the CPU's address sizes, as /proc/cpuinfo prints them
        (virtual bits default to 48, x86-64's 4-level paging)."""
        if self.address_bits is not None:
            raise self.fail("a second 'cpu' line (one CPU kind per host)")
        kv = self.keyvals(tokens[1:], {"phys-bits", "virt-bits"})
        if "phys-bits" not in kv:
            raise self.fail("cpu needs phys-bits=N (the `address sizes` of the node's /proc/cpuinfo)")
        self.address_bits = (self.int_value("phys-bits", kv["phys-bits"], 32, 64),
                             self.int_value("virt-bits", kv.get("virt-bits", "48"), 32, 64))

    def numa_line(self, tokens: list[str]) -> None:
        node = self.int_value("numa", tokens[1], 0, 1023)
        kv = self.keyvals(tokens[2:], {"cpus"})
        if "cpus" not in kv:
            raise self.fail(f"numa {node} needs cpus=LIST")
        try:
            cpus = tuple(sorted(parse_cpuset(kv["cpus"])))  # the kernel's and libvirt's list syntax
        except PcitopoError as e:
            raise self.fail(e.reason) from None
        if not cpus:
            raise self.fail(f"numa {node}: cpus={kv['cpus']} names no CPU")
        for other in self.numa:
            if other.node == node:
                raise self.fail(f"numa {node} is already declared on line {other.line}")
            if set(other.cpus) & set(cpus):
                raise self.fail(f"numa {node} shares CPUs with numa {other.node} (line {other.line})")
        self.numa.append(NumaSpec(node, cpus, self.lineno))

    def rc_line(self, tokens: list[str]) -> None:
        m = _RC_RE.match(tokens[1])
        if not m:
            raise self.fail(f"rc address {tokens[1]!r} is not DDDD:BB")
        kv = self.keyvals(tokens[2:], {"numa"})
        if "numa" not in kv:
            raise self.fail("rc needs numa=N (numa=-1 if the firmware does not say)")
        domain, bus = int(m.group(1), 16), int(m.group(2), 16)
        for other in self.roots:
            if (other.domain, other.bus) == (domain, bus):
                raise self.fail(f"rc {tokens[1]} is already declared on line {other.line}")
        numa = self.int_value("numa", kv["numa"], -1, 1023)
        root = RootSpec(domain, bus, numa, self.lineno)
        self.roots.append(root)
        self.stack = [(0, root, None)]

    def device_line(self, kind: str, tokens: list[str], parent: RootSpec | DeviceSpec) -> DeviceSpec:
        where = f"{kind} {tokens[1]}"
        parent_kind = "rc" if isinstance(parent, RootSpec) else parent.kind
        if parent_kind not in PARENTS[kind]:
            raise self.fail(f"{where} cannot sit under {parent_kind} (only under {' or '.join(PARENTS[kind])})")
        domain = parent.domain if isinstance(parent, RootSpec) else parent.bdf.domain
        m = BDF_RE.match(tokens[1])
        if not m or not _written_in_full(m):
            raise self.fail(f"{tokens[1]!r} is not a PCI address (BB:DD.F or DDDD:BB:DD.F)")
        if m.group(1) is not None and int(m.group(1), 16) != domain:
            raise self.fail(f"{where} is in another PCI domain than its rc")
        bdf = Bdf(domain, int(m.group(2), 16), int(m.group(3), 16), int(m.group(4)))
        if bdf.slot > 31:
            raise self.fail(f"{where}: device number above 1f")
        self.check_bus(where, bdf, parent)

        kv = self.keyvals(tokens[2:], _EP_KEYS if kind == "ep" else _DEVICE_KEYS)
        look = self.resolve_look(where, kind, kv, parent)
        numa = parent.numa
        if "numa" in kv:
            numa = self.int_value("numa", kv["numa"], -1, 1023)
        dev = DeviceSpec(kind, bdf, look, numa, self.lineno)
        if "functions" in kv:
            dev.functions = self.int_value("functions", kv["functions"], 1, 8)
            if bdf.function != 0:
                raise self.fail(f"{where}: functions= counts from function 0; write {bdf.with_function(0)}")
        if "vfs" in kv:
            dev.vfs = self.int_value("vfs", kv["vfs"], 0, 65535)
            if dev.vfs and look.vf_device is None:
                raise self.fail(f"{where}: this device has no SR-IOV VF id (vfs= needs a NIC preset)")
        if "iommu" in kv:
            dev.iommu = self.int_value("iommu", kv["iommu"], 0, 1_000_000)
        if "rdma" in kv:
            dev.rdma = tuple(kv["rdma"].split(","))
            if len(dev.rdma) != dev.functions or not all(_RDMA_RE.match(n) for n in dev.rdma):
                raise self.fail(f"{where}: rdma= takes one RDMA device name per function ({dev.functions}), comma-separated")
        for b in dev.function_bdfs():
            self.claim(b, where, "")
        for vf, pf in dev.vf_bdfs():
            if vf.bus > 0xFF:
                raise self.fail(f"{where}: {dev.vfs} VFs run past bus ff")
            self.claim(vf, where, f" (a VF of {pf})")
        return dev

    def claim(self, bdf: Bdf, where: str, what: str) -> None:
        if bdf in self.seen:
            line, other = self.seen[bdf]
            raise self.fail(f"{where}: {bdf}{what} is already used on line {line}{other}")
        self.seen[bdf] = (self.lineno, what)

    def check_bus(self, where: str, bdf: Bdf, parent: RootSpec | DeviceSpec) -> None:
        if isinstance(parent, RootSpec):
            if bdf.bus != parent.bus:
                raise self.fail(f"{where} must be on its root bus {parent.bus:02x}")
            return
        if bdf.bus <= parent.bdf.bus:
            raise self.fail(f"{where} must be on a bus above its bridge's bus {parent.bdf.bus:02x}")
        sec = self.secondary.setdefault(id(parent), bdf.bus)
        if bdf.bus != sec:
            raise self.fail(f"{where}: all children of {parent.kind} {parent.bdf} share one bus ({sec:02x})")
        if parent.kind in ("rp", "ds") and bdf.slot != 0:
            raise self.fail(f"{where}: below a port, the one device on the link is device 00")

    def resolve_look(self, where: str, kind: str, kv: dict[str, str], parent: RootSpec | DeviceSpec) -> Look:
        if "preset" in kv:
            if kv["preset"] not in PRESETS:
                raise self.fail(f"{where}: unknown preset {kv['preset']!r} (known: {', '.join(sorted(PRESETS))})")
            look = PRESETS[kv["preset"]]
        elif kind == "ds" and isinstance(parent, DeviceSpec):
            look = parent.look  # a downstream port looks like the switch it belongs to
        elif "ids" in kv and "class" in kv:
            look = Look(0, 0, 0)
        else:
            raise self.fail(f"{where} needs preset= (or ids= and class=)")
        if "ids" in kv:
            v, d = self.ids(kv["ids"])
            look = replace(look, vendor=v, device=d)
        if "sub" in kv:
            sv, sd = self.ids(kv["sub"])
            look = replace(look, sub_vendor=sv, sub_device=sd)
        if "class" in kv:
            if not re.match(rf"^0x{_HEX}{{6}}$", kv["class"]):
                raise self.fail(f"class={kv['class']!r} is not 0xCCCCCC")
            look = replace(look, class_code=int(kv["class"], 16))
        for key, attr in (("speed", "max_speed"), ("cur-speed", "cur_speed")):
            if key in kv:
                if kv[key].lower() not in SPEEDS:
                    raise self.fail(f"{key}={kv[key]} is not one of {', '.join(SPEEDS)}")
                look = replace(look, **{attr: SPEEDS[kv[key].lower()]})
        for key, attr in (("width", "max_width"), ("cur-width", "cur_width")):
            if key in kv:
                w = self.int_value(key, kv[key], 0, 32)
                if w not in WIDTHS:
                    raise self.fail(f"{key}={w} is not a PCIe link width")
                look = replace(look, **{attr: w})
        if "driver" in kv:
            look = replace(look, driver=None if kv["driver"] == "none" else kv["driver"])
        if "omit" in kv:
            names: set[str] = set()
            for n in kv["omit"].split(","):
                if n == "link":
                    names.update(LINK_FILES)
                elif n in OMITTABLE:
                    names.add(n)
                else:
                    raise self.fail(f"omit={n!r}: only optional files can be left out "
                                    f"({', '.join(sorted(OMITTABLE))}, or link)")
            look = replace(look, omit=look.omit | names)
        look = self.doctor_keys(kv, look)
        is_bridge_kind = kind in BRIDGE_KINDS
        if look.is_bridge != is_bridge_kind:
            want = "a bridge class (0x0604xx)" if is_bridge_kind else "a non-bridge class"
            raise self.fail(f"{where} needs {want}, has class 0x{look.class_code:06x}")
        return look

    def doctor_keys(self, kv: dict[str, str], look: Look) -> Look:
        """pcitopo doctor: fault=, override=, iommu-type= (see synth/doctorfiles.py)."""
        if "fault" in kv:
            names = kv["fault"].split(",")
            problem = synth_doctor.check_faults(names)
            if problem:
                raise self.fail(problem)
            look = replace(look, faults=look.faults | frozenset(names))
            if "bar-unassigned" in names and not look.bars:
                raise self.fail("fault=bar-unassigned: this function has no BARs (use a preset that has them)")
        if "override" in kv:
            look = replace(look, override=kv["override"])
        if "iommu-type" in kv:
            if kv["iommu-type"] not in synth_doctor.GROUP_TYPES:
                raise self.fail(f"iommu-type={kv['iommu-type']!r} is not one of {', '.join(synth_doctor.GROUP_TYPES)}")
            look = replace(look, iommu_type=kv["iommu-type"])
        return look

    def ids(self, text: str) -> tuple[int, int]:
        m = _IDS_RE.match(text)
        if not m:
            raise self.fail(f"{text!r} is not VVVV:DDDD")
        return int(m.group(1), 16), int(m.group(2), 16)


def _check(spec: HostSpec, p: _Parser) -> None:
    """Whole-description checks: NUMA nodes exist, and bus ranges nest like a real bus scan
    (every bridge's subtree, VF buses included, is a range of its own that no sibling shares)."""
    nodes = {n.node for n in spec.numa}
    for r in spec.roots:
        if r.numa != -1 and r.numa not in nodes:
            raise p.fail(f"rc numa={r.numa}: no 'numa {r.numa}' line", r.line)
    for d in spec.devices():
        if d.numa != -1 and d.numa not in nodes:
            raise p.fail(f"numa={d.numa}: no 'numa {d.numa}' line", d.line)

    def spans(children: list[DeviceSpec]) -> list[tuple[int, int, DeviceSpec]]:
        """The bus range each child occupies below the bus it sits on: a bridge's subtree, or
        the extra buses an endpoint's VFs spill onto."""
        out = []
        for c in children:
            vf_hi = max((vf.bus for vf, _ in c.vf_bdfs()), default=c.bdf.bus)
            if vf_hi > c.bdf.bus:
                out.append((c.bdf.bus + 1, vf_hi, c))
            e = extent(c)
            if e is not None:
                out.append((e[0], e[1], c))
        _disjoint(out, p)
        return out

    def extent(d: DeviceSpec) -> tuple[int, int] | None:
        """Buses below ``d`` (its secondary .. subordinate), None for a leaf or an empty port."""
        if not d.children:
            return None
        sec = d.children[0].bdf.bus
        hi = sec
        for lo, top, c in spans(d.children):
            if lo <= sec:
                raise p.fail(f"{c.kind} {c.bdf}: the buses below it must be above {sec:02x}", c.line)
            hi = max(hi, top)
        return sec, hi

    by_domain: dict[int, list[tuple[int, int, RootSpec | DeviceSpec]]] = {}
    for r in spec.roots:
        hi = max([r.bus] + [top for _, top, _ in spans(r.children)])
        by_domain.setdefault(r.domain, []).append((r.bus, hi, r))
    for ranges in by_domain.values():
        _disjoint(ranges, p)


def _disjoint(spans: Sequence[tuple[int, int, RootSpec | DeviceSpec]], p: _Parser) -> None:
    ordered = sorted(spans, key=lambda s: (s[0], s[1]))
    for (alo, ahi, a), (blo, bhi, b) in zip(ordered, ordered[1:]):
        if blo <= ahi:
            raise p.fail(f"{_label(b)} uses buses {blo:02x}-{bhi:02x}, overlapping {_label(a)} "
                         f"(line {a.line}, buses {alo:02x}-{ahi:02x})", b.line)


def _label(x: RootSpec | DeviceSpec) -> str:
    return f"rc {x.domain:04x}:{x.bus:02x}" if isinstance(x, RootSpec) else f"{x.kind} {x.bdf}"


def parse_topo(text: str, name: str) -> HostSpec:
    """Parse a host description. Raises :class:`TopoError` (a SysfsError) naming the line."""
    return _Parser(text, name).parse()
