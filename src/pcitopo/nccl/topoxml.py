"""NCCL's topology file and its PCIe link prices, the way NCCL itself reads them.

Standard library only, Python 3.8 or newer: this module runs inside guests (``pcitopo guest
install-nccl-topo``, ``pcitopo verify``) as well as in the hook.

What it follows (NCCL ``src/graph/xml.cc``, ``xml.h``, ``topo.cc``, ``src/os/linux.cc``):

- The file parser is not an XML parser. It reads element by element: whitespace between
  elements is space, CR or LF only; attributes are separated by one space each; values are
  quoted (``"`` or ``'``) and taken literally (no entities); ``<!-- -->`` comments are skipped;
  an XML declaration is an error. At most 255 characters per name or value, 16 attributes per
  element (more are ignored), 640 children per element, 256 elements.
- Known elements by parent: ``system`` (needs ``version="1"``) > ``cpu`` > ``pci``/``nic``;
  ``pci`` > ``pci``/``gpu``/``nic``/``pcilink``; ``gpu`` > ``nvlink``/``c2c``; ``nic`` > ``net``.
  Anything else is skipped with its children.
- A PCI node's link comes from the file when the file gives it; otherwise from sysfs: the lower
  of the device's ``max_link_speed`` and the port above it (a value that does not parse as
  ``"%f GT/s"``, such as ``Unknown``, is ignored) and the lower of the two widths.
- ``link_speed`` is looked up in NCCL's table by prefix; anything else counts as 8 GT/s (Gen3).
  A width of 0 counts as 16. Bandwidth in GB/s = width x rate / 80.
- A node's parent comes from the file when the file nests it; otherwise from sysfs: the port
  directly above is skipped, the component above that is the parent if it is a PCI address,
  else the node hangs off the CPU of its ``numa_node``.
- Broadcom PEX switches presenting two levels are flattened into one (``getBcmGen``).
"""

import base64
import binascii
import os
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from pcitopo.host.files import write_atomic

MAX_STR_LEN = 255
MAX_ATTR_COUNT = 16
MAX_SUBS = 640
MAX_NODES = 256
TOPO_XML_VERSION = "1"
# Where NCCL looks when NCCL_TOPO_FILE is unset (ncclTopoGetSystem).
DEFAULT_TOPO_FILE = "/var/run/nvidia-topologyd/virtualTopology.xml"
BRIDGE_CLASS = "0x060400"

# kvDictPciGen: NCCL's link speed table (x 100 Mb/s per lane), matched by prefix, in order.
PCI_GEN = (
    ("2.5 GT/s", 15), ("5 GT/s", 30), ("8 GT/s", 60), ("16 GT/s", 120), ("32 GT/s", 240),
    ("2.5 GT/s PCIe", 15), ("5.0 GT/s PCIe", 30), ("8.0 GT/s PCIe", 60), ("16.0 GT/s PCIe", 120),
    ("32.0 GT/s PCIe", 240), ("64.0 GT/s PCIe", 480),
)
FALLBACK_RATE = 60
# The spelling a current kernel (and NCCL's NVML path) uses for each rate.
CANONICAL_SPEED = {15: "2.5 GT/s PCIe", 30: "5.0 GT/s PCIe", 60: "8.0 GT/s PCIe", 120: "16.0 GT/s PCIe",
                   240: "32.0 GT/s PCIe", 480: "64.0 GT/s PCIe"}

_HANDLERS = {
    None: ("system",),
    "system": ("cpu",),
    "cpu": ("pci", "nic"),
    "pci": ("pci", "gpu", "nic", "pcilink"),
    "gpu": ("nvlink", "c2c"),
    "nic": ("net",),
}


class NcclXmlError(ValueError):
    """The file would make NCCL's topology loading fail; the message says where and why."""


class XmlNode:
    """One element as NCCL keeps it: name, attributes in file order, children."""

    def __init__(self, name: str, attrs: Sequence[Tuple[str, str]] = (), parent: "Optional[XmlNode]" = None):
        self.name = name
        self.attrs = list(attrs)
        self.parent = parent
        self.subs: List[XmlNode] = []

    def get(self, key: str) -> Optional[str]:
        for k, v in self.attrs:
            if k == key:
                return v
        return None

    def set(self, key: str, value: str) -> None:
        for i, (k, _) in enumerate(self.attrs):
            if k == key:
                self.attrs[i] = (k, value)
                return
        self.attrs.append((key, value))

    def walk(self) -> "Iterable[XmlNode]":
        yield self
        for s in self.subs:
            yield from s.walk()


# -- the parser (xmlGetChar, xmlGetValue, xmlGetToken, xmlGetNode, xmlLoadSub) ------------------

class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0
        self.count = 0
        self.top: List[XmlNode] = []

    def char(self) -> str:
        if self.pos >= len(self.data):
            raise NcclXmlError("unexpected end of file")
        c = chr(self.data[self.pos])
        self.pos += 1
        return c

    def value(self) -> Tuple[str, str]:
        q = self.char()
        if q not in "\"'":
            raise NcclXmlError(f"byte {self.pos}: expected a quoted value, got {q!r}")
        out = []
        while True:
            c = self.char()
            if c == q:
                break
            out.append(c)
            if len(out) >= MAX_STR_LEN:
                raise NcclXmlError(f"byte {self.pos}: value longer than {MAX_STR_LEN - 1} characters")
        return "".join(out), self.char()

    def token(self, with_value: bool) -> Tuple[str, Optional[str], str]:
        out = []
        while True:
            c = self.char()
            if c == "=":
                if not with_value:
                    raise NcclXmlError(f"byte {self.pos}: unexpected value after {''.join(out)!r}")
                v, last = self.value()
                return "".join(out), v, last
            if c in " >/\n\r":
                return "".join(out), None, c
            out.append(c)
            if len(out) >= MAX_STR_LEN:
                raise NcclXmlError(f"byte {self.pos}: name longer than {MAX_STR_LEN - 1} characters")

    def skip_comment(self, start: str, nxt: str) -> None:
        end = "..." + start + nxt
        while not end.endswith("-->"):
            end = end[-2:] + self.char()

    def node(self) -> Optional[Tuple[str, str, List[Tuple[str, str]]]]:
        """(kind, name, attrs) with kind open|close|single, or None at the end of the data."""
        c = " "
        while c in " \n\r":
            if self.pos >= len(self.data):
                return None
            c = self.char()
        if c != "<":
            raise NcclXmlError(f"byte {self.pos}: expected '<', got {c!r}")
        name, _, c = self.token(False)
        if name.startswith("!--"):
            self.skip_comment(name[3:], c)
            return self.node()
        if name == "" and c == "/":
            name, _, c = self.token(False)
            if c != ">":
                raise NcclXmlError(f"byte {self.pos}: unexpected {c!r} in closing tag {name}")
            return "close", name, []
        attrs: List[Tuple[str, str]] = []
        while c == " ":
            key, val, c = self.token(True)
            if len(attrs) < MAX_ATTR_COUNT:
                attrs.append((key, val if val is not None else ""))
        kind = "open"
        if c == "/":
            kind = "single"
            _, _, c = self.token(False)
        if c != ">":
            raise NcclXmlError(f"byte {self.pos}: expected '>' in <{name}>, got {c!r}")
        return kind, name, attrs

    def load(self, head: Optional[XmlNode], head_single: bool, handlers: Sequence[str]) -> None:
        if head_single:
            return
        while True:
            got = self.node()
            if got is None:
                if head is not None:
                    raise NcclXmlError(f"unterminated <{head.name}>")
                return
            kind, name, attrs = got
            if head is not None and kind == "close":
                if name != head.name:
                    raise NcclXmlError(f"<{head.name}> closed by </{name}>")
                return
            if name in handlers:
                if self.count >= MAX_NODES:
                    raise NcclXmlError(f"more than {MAX_NODES} elements")
                self.count += 1
                node = XmlNode(name, attrs, head)
                if head is not None:
                    if len(head.subs) >= MAX_SUBS:
                        raise NcclXmlError(f"more than {MAX_SUBS} children in <{head.name}>")
                    head.subs.append(node)
                else:
                    self.top.append(node)
                self.load(node, kind == "single", _HANDLERS.get(name, ()))
            else:
                self.load(XmlNode(name, attrs), kind == "single", ())


def parse(data: bytes) -> XmlNode:
    """The ``<system>`` element of an NCCL topology file, parsed and checked the way NCCL loads
    it; :class:`NcclXmlError` for anything that would make NCCL's init fail."""
    r = _Reader(data)
    r.load(None, False, _HANDLERS[None])
    systems = [n for n in r.top if n.name == "system"]
    if not systems:
        raise NcclXmlError("no <system> element")
    system = systems[0]
    version = system.get("version")
    if version is None:
        raise NcclXmlError("<system> has no version attribute")
    if strtol(version) != int(TOPO_XML_VERSION):
        raise NcclXmlError(f"<system version={version!r}>: NCCL needs version {TOPO_XML_VERSION}")
    check(system)
    return system


def strtol(text: str) -> int:
    """C's strtol(text, NULL, 0): leading whitespace, sign, 0x/0 prefixes, stops at junk."""
    s = text.lstrip()
    sign = -1 if s[:1] == "-" else 1
    s = s[1:] if s[:1] in "+-" else s
    base, digits = 10, "0123456789"
    if s[:2].lower() == "0x":
        base, s, digits = 16, s[2:], "0123456789abcdef"
    elif s[:1] == "0":
        base, digits = 8, "01234567"
    n = 0
    for ch in s.lower():
        if ch not in digits:
            break
        n = n * base + digits.index(ch)
    return sign * n


def is_busid(text: str) -> bool:
    """NCCL's checkBDFFormat: ``dddd:bb:dd.f`` in hex, exactly 12 characters."""
    hexd = "0123456789abcdefABCDEF"
    return (len(text) == 12 and text[4] == ":" and text[7] == ":" and text[10] == "."
            and all(text[i] in hexd for i in (0, 1, 2, 3, 5, 6, 8, 9, 11)))


def check(system: XmlNode) -> None:
    """What NCCL needs of the nodes a file provides: a numaid per ``cpu``, and per ``pci`` a
    well-formed busid, a class, a link speed and a link width (NCCL would read missing ones
    from the guest's own sysfs, which is what this file exists to override)."""
    seen: Dict[str, str] = {}
    for n in system.walk():
        if n.name == "cpu" and n.get("numaid") is None:
            raise NcclXmlError("<cpu> without numaid")
        if n.name != "pci":
            continue
        busid = n.get("busid")
        if busid is None or not is_busid(busid):
            raise NcclXmlError(f"<pci busid={busid!r}>: not a dddd:bb:dd.f address")
        if busid in seen:
            raise NcclXmlError(f"<pci busid={busid!r}> appears twice")
        seen[busid] = busid
        for key in ("class", "link_speed", "link_width"):
            if n.get(key) is None:
                raise NcclXmlError(f"<pci busid={busid!r}> has no {key}")


# -- bandwidth ------------------------------------------------------------------------------

def rate(speed: Optional[str]) -> int:
    """kvConvertToInt over kvDictPciGen: the first table entry that prefixes ``speed``."""
    for prefix, r in PCI_GEN:
        if speed is not None and speed.startswith(prefix):
            return r
    return FALLBACK_RATE


def bandwidth(speed: Optional[str], width: Optional[str]) -> float:
    """GB/s of one PCI link as ncclTopoAddPci prices it."""
    w = strtol(width or "")
    if w == 0:
        w = 16
    return w * rate(speed) / 80.0


def canonical_speed(speed: str) -> str:
    """The table spelling NCCL reads at the same rate as ``speed`` does; a spelling NCCL does
    not know is kept, so it falls back exactly as it did where it was read."""
    return CANONICAL_SPEED[rate(speed)] if any(speed.startswith(p) for p, _ in PCI_GEN) else speed


_FLOAT = re.compile(r"\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")


def gt_s(text: str) -> Optional[float]:
    """sscanf("%f GT/s"): the leading number, or None when there is none ("Unknown")."""
    m = _FLOAT.match(text)
    return float(m.group(1)) if m else None


def sysfs_link(own_speed: str, port_speed: str, own_width: str, port_width: str) -> Tuple[str, str]:
    """(link_speed, link_width) NCCL derives from a device's and its port's sysfs files."""
    d, p = gt_s(own_speed), gt_s(port_speed)
    speed = port_speed if (p is not None and (d is None or p < d)) else own_speed
    return speed, str(min(strtol(own_width), strtol(port_width)))


# The fw_cfg entry the hook fills (base64: libvirt escapes markup in inline fw_cfg values) and
# where a Linux guest reads it (module qemu_fw_cfg).
FWCFG_NAME = "opt/io.kubevirt.pcitopo/nccl-topo.xml.b64"
FWCFG_DIR = "/sys/firmware/qemu_fw_cfg"


def fwcfg_raw_path(sys_root: str = "/sys") -> str:
    return os.path.join(sys_root, "firmware", "qemu_fw_cfg", "by_name", *FWCFG_NAME.split("/"), "raw")


def decode_offered(blob: bytes) -> bytes:
    """The topology file inside the fw_cfg blob; :class:`NcclXmlError` when it is not base64
    or not a file NCCL would load."""
    try:
        data = base64.b64decode(blob.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise NcclXmlError("the fw_cfg blob is not base64 (not written by pcitopo?)") from None
    parse(data)
    return data


def install(data: bytes, dest: str = DEFAULT_TOPO_FILE) -> None:
    """Check ``data`` under NCCL's rules and write it to ``dest`` atomically (its directory is
    created, the file is world-readable: every NCCL process reads it)."""
    parse(data)
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    write_atomic(dest, data, mode=0o644)  # root writes here at every boot: see its rules
