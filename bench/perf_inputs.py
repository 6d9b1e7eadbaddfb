"""What ``bench/perf.py`` measures on: the fixture hosts materialised as real directories, the
hgx-b200 domain and its VMI JSON, the 24-device hgx-h100 domain, the files and links the floor
reads, the library's answer every call must match; and the settings the measurements and the
table share."""

from __future__ import annotations

import hashlib
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

from harness import CODE  # bench/harness.py: the script's own folder is first on sys.path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "bench"
HOST = "hgx-b200"
PREFIX = "pcitopo.kubevirt.io/"
# What a user who follows docs/DEPLOY.md puts on the VMI.
OUR_ANNOTATIONS = {PREFIX + "mode": "mirror", PREFIX + "on-error": "fail"}
CONCURRENCY = 64
# The 24-device VM: fixtures/hgx-h100/domain.xml (8 GPUs, 8 compute ConnectX-7, both ports of
# the 2 storage ConnectX-7: 20 hostdevs) plus the host's 4 NVSwitches (05:00.0-08:00.0, on
# vfio-pci in the fixture), as a full-passthrough HGX H100 VM takes them.
H100 = "hgx-h100"
H100_NVSWITCHES = ("0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0")


def ensure_bytecode() -> None:
    """Up-to-date .pyc files for the project's own packages, as the image has them (pip compiles
    at install; the image sets PYTHONDONTWRITEBYTECODE). Without them every child process would
    compile the changed modules again: slower starts and ~1-4 MiB more RSS than in production."""
    import compileall

    compileall.compile_dir(str(CODE["root"] / "src" / "pcitopo"), quiet=2)


def materialise(name: str) -> Path:
    """The fixture's capture tarball as a real directory (symlinks as symlinks), built once per
    tarball content under .cache/bench/ and reused (a sriov-4k tree is ~67,000 entries)."""
    tarball = ROOT / "fixtures" / name / "sysfs.tar.gz"
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()[:12]
    dest = CACHE / f"{name}-{digest}"
    if (dest / "bus" / "pci" / "devices").is_dir():
        return dest
    if dest.exists():  # a tree cut short (the cache removed under a run that was filling it): again
        import shutil

        shutil.rmtree(dest, ignore_errors=True)
    tmp = CACHE / f".{name}-{digest}.{os.getpid()}"
    made: set[str] = set()
    with tarfile.open(tarball, mode="r:gz") as tar:
        for m in tar:
            rel = m.name[2:] if m.name.startswith("./") else m.name
            if not rel or rel == ".":
                continue
            if rel.startswith("/") or ".." in rel.split("/"):
                raise SystemExit(f"{tarball}: unexpected member {m.name!r}")
            path = os.path.join(tmp, rel)
            parent = os.path.dirname(path)
            if parent not in made:
                os.makedirs(parent, exist_ok=True)
                made.add(parent)
            if m.isdir():
                os.makedirs(path, exist_ok=True)
                made.add(path)
            elif m.issym():
                os.symlink(m.linkname, path)
            elif m.isfile():
                with open(path, "wb") as fh:
                    fh.write(tar.extractfile(m).read())
    try:
        os.rename(tmp, dest)
    except OSError:  # another run got there first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def read_bytes(pid: int) -> int:
    """Bytes the process read with read() so far (/proc/PID/io rchar): Python bytecode, sysfs,
    requests. An upper bound of the page cache it adds to its memory cgroup besides its RSS."""
    with open(f"/proc/{pid}/io") as fh:
        for line in fh:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0


def hostdev_bdfs(domain: bytes) -> list[str]:
    from lxml import etree

    out = []
    for a in etree.fromstring(domain).iterfind("devices/hostdev/source/address"):
        dom, bus, slot, fn = (int(a.get(k, "0"), 16) for k in ("domain", "bus", "slot", "function"))
        out.append(f"{dom:04x}:{bus:02x}:{slot:02x}.{fn:x}")
    return out


def allocations(domain: bytes) -> list[bytes]:
    """The domain less one of its hostdevs, for each hostdev: as many allocations as devices."""
    from lxml import etree

    out = []
    for i in range(len(hostdev_bdfs(domain))):
        root = etree.fromstring(domain)
        devices = root.find("devices")
        devices.remove(devices.findall("hostdev")[i])
        out.append(etree.tostring(root))
    return out


def with_hostdevs(domain: bytes, bdfs: tuple[str, ...], alias: str) -> bytes:
    """The domain with one more PCI hostdev per BDF, written as its last hostdev is (KubeVirt's
    shape), aliased ``ua-<alias><n>``."""
    import copy

    from lxml import etree

    root = etree.fromstring(domain)
    last = root.findall("devices/hostdev")[-1]
    for n, bdf in enumerate(bdfs):
        dom, bus, rest = bdf.split(":")
        slot, fn = rest.split(".")
        hd = copy.deepcopy(last)
        a = hd.find("source/address")
        a.set("domain", f"0x{dom}"), a.set("bus", f"0x{bus}"), a.set("slot", f"0x{slot}"), a.set("function", f"0x{fn}")
        hd.find("alias").set("name", f"ua-{alias}{n}")
        last.addnext(hd)
        last = hd
    return etree.tostring(root)


def floor_paths(sysfs: Path, domain: bytes) -> tuple[list[str], list[str]]:
    """(files, links) the job cannot avoid: for every assigned device and every bridge above it,
    its bus/pci/devices link, each attribute file in its directory and each symlink there (driver,
    iommu_group, physfn); plus every NUMA node's cpulist. Listed once, outside the timing."""
    from pcitopo.model.tree import is_bdf

    files: list[str] = []
    links: list[str] = []
    dirs: dict[str, None] = {}
    for bdf in hostdev_bdfs(domain):
        link = sysfs / "bus" / "pci" / "devices" / bdf
        links.append(str(link))
        real = os.path.realpath(link)
        while is_bdf(os.path.basename(real)):
            if real not in dirs:
                dirs[real] = None
                links.append(str(sysfs / "bus" / "pci" / "devices" / os.path.basename(real)))
            real = os.path.dirname(real)
    for d in dirs:
        for e in os.scandir(d):
            if e.is_symlink():
                links.append(e.path)
            elif e.is_file():
                files.append(e.path)
    node_dir = sysfs / "devices" / "system" / "node"
    for e in os.scandir(node_dir):
        if e.name.startswith("node") and (Path(e.path) / "cpulist").exists():
            files.append(str(Path(e.path) / "cpulist"))
    return files, sorted(set(links))


@dataclass(frozen=True)
class Inputs:
    """Everything the measurements run on, prepared once outside the timing."""

    b200: str  # the hgx-b200 tree as a directory
    h100: str
    s4k: str  # sriov-4k: 4,185 functions
    domain_path: Path
    domain: bytes  # fixtures/hgx-b200/domain.xml, KubeVirt-shaped
    h100_domain: bytes
    vmi: bytes  # VMI JSON with OUR_ANNOTATIONS
    vmi_plain: bytes  # the same without any pcitopo annotation
    files: list[str]  # what the floor reads (floor_paths)
    links: list[str]
    expected: bytes  # the library's answer for domain on hgx-b200: what every call must return
    d24: bytes  # the 24-device domain on hgx-h100 (H100_NVSWITCHES)
    vmi24: bytes
    files24: list[str]
    links24: list[str]
    expected24: bytes

    def facts(self) -> dict[str, int]:
        """The sizes the table's header prints."""
        return {"domain_bytes": len(self.domain), "hostdevs": len(hostdev_bdfs(self.domain)), "vmi_bytes": len(self.vmi),
                "floor_files": len(self.files), "floor_links": len(self.links),
                "d24_bytes": len(self.d24), "d24_hostdevs": len(hostdev_bdfs(self.d24)), "vmi24_bytes": len(self.vmi24),
                "floor24_files": len(self.files24), "floor24_links": len(self.links24)}


def load_inputs() -> Inputs:
    from pcitopo.guest.rewrite import rewrite_domain
    from pcitopo.host.sysfs import open_host
    from testkit.hookkit import vmi_json

    b200 = materialise(HOST)
    domain_path = ROOT / "fixtures" / HOST / "domain.xml"
    domain = domain_path.read_bytes()
    files, links = floor_paths(b200, domain)
    h100 = materialise(H100)
    h100_domain = (ROOT / "fixtures" / H100 / "domain.xml").read_bytes()
    d24 = with_hostdevs(h100_domain, H100_NVSWITCHES, "nvswitch")
    files24, links24 = floor_paths(h100, d24)
    return Inputs(
        b200=str(b200), h100=str(h100), s4k=str(materialise("sriov-4k")),
        domain_path=domain_path, domain=domain, h100_domain=h100_domain,
        vmi=vmi_json(domain, annotations=OUR_ANNOTATIONS), vmi_plain=vmi_json(domain),
        files=files, links=links, expected=rewrite_domain(domain, open_host(str(b200))).xml,
        d24=d24, vmi24=vmi_json(d24, annotations=OUR_ANNOTATIONS), files24=files24, links24=links24,
        expected24=rewrite_domain(d24, open_host(str(h100))).xml,
    )
