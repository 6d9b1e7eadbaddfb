"""NVLink fabric partitions: what NVIDIA Fabric Manager says, read from ``fmpm -l``.

On HGX boards in shared-NVSwitch mode a VM's GPUs get NVLink only when they are exactly one
*activated* fabric partition. Partitions are defined by GPU physical (module) ID, which is not in
sysfs and not in PCI order, so the fabric file is the source of truth for module → BDF, with one
exception: where Fabric Manager cannot see the GPUs (bound to vfio-pci, or FM running in a
service VM) it prints ``pciBusId`` ``00000000:00:00.0`` and an empty ``uuid``. Then a module map
(``{"gpus": [{"module", "bdf"}]}``, captured once per node model, e.g. with
``nvidia-smi --query-gpu=module_id,pci.bus_id`` before binding to vfio-pci) supplies the BDFs.
Every :class:`Fabric` says which source it used.

The file formats are validated with pydantic (imported on first use only: a sidecar without
``--fabric`` never pays for it). Errors are one line (:class:`FabricError`, exit 2).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from pcitopo.errors import ConfigError, FabricError, MalformedBdfError
from pcitopo.host.files import read_bounded
from pcitopo.model.tree import NVIDIA, Bdf, Role, Topology
from pcitopo.paths.classify import NvlinkBoard, NvlinkTable

# A fabric file is a few KB (15 partitions of at most 8 GPUs); anything far larger is not one.
MAX_FABRIC_BYTES = 1024 * 1024
# What fmpm prints for a GPU Fabric Manager cannot see (vfio-pci, or FM in a service VM).
PLACEHOLDER_BUS_IDS = frozenset({"", "00000000:00:00.0", "0000:00:00.0"})

SOURCE_FABRIC = "fabric file"
SOURCE_MAP = "module map"
SOURCE_BOTH = "fabric file and module map"
SOURCE_NONE = "none (placeholder BDFs and no module map)"


@dataclass(frozen=True, slots=True)
class FabricGpu:
    """One GPU of a partition: its module (physical) ID, its BDF on this host (None when no
    source names it) and its NVLinks (available now / the most it can have)."""

    module: int
    bdf: Bdf | None
    links: int
    max_links: int

    @property
    def degraded(self) -> bool:
        return self.links < self.max_links


@dataclass(frozen=True, slots=True)
class Partition:
    id: int
    active: bool
    gpus: tuple[FabricGpu, ...]

    @property
    def modules(self) -> frozenset[int]:
        return frozenset(g.module for g in self.gpus)

    def modules_text(self) -> str:
        return "{" + ",".join(str(m) for m in sorted(self.modules)) + "}"


@dataclass(frozen=True)
class Fabric:
    """The partitions of one node, with module → BDF resolved from ``source``."""

    partitions: tuple[Partition, ...]
    source: str
    path: str

    def module_of(self, bdf: Bdf) -> int | None:
        for p in self.partitions:
            for g in p.gpus:
                if g.bdf == bdf:
                    return g.module
        return None

    def bdf_of(self, module: int) -> Bdf | None:
        for p in self.partitions:
            for g in p.gpus:
                if g.module == module and g.bdf is not None:
                    return g.bdf
        return None

    @property
    def bdf_origin(self) -> str:
        """Where the GPUs' BDFs came from, for people: "GPU BDFs from the module map"."""
        return "GPU BDFs unknown: placeholder BDFs and no module map" if self.source == SOURCE_NONE else f"GPU BDFs from the {self.source}"

    @property
    def mapped(self) -> bool:
        """Whether every GPU of every partition has a BDF."""
        return all(g.bdf is not None for p in self.partitions for g in p.gpus)

    def gpu_bdfs(self) -> frozenset[Bdf]:
        return frozenset(g.bdf for p in self.partitions for g in p.gpus if g.bdf is not None)


# -- parsing -------------------------------------------------------------------------------------

def normalise_bus_id(text: str) -> Bdf:
    """``00000000:1A:00.0`` (NVML/FM: 8-hex-digit domain, upper case) → ``0000:1a:00.0``.
    The address rule itself stays :meth:`Bdf.parse`'s; this only narrows the domain."""
    t = text.strip()
    head, sep, rest = t.partition(":")
    if sep and len(head) == 8 and rest.count(":") == 1:
        try:
            dom = int(head, 16)
        except ValueError:
            dom = -1
        if not 0 <= dom <= 0xFFFF:
            raise MalformedBdfError(f"malformed BDF: not a PCI address: {text!r} (PCI domain above ffff)")
        t = f"{dom:04x}:{rest}"
    return Bdf.parse(t)


@lru_cache(maxsize=1)
def _models():
    """The pydantic models of both file formats (built once, on first use)."""
    from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

    count = Field(ge=0, le=1 << 20)

    class FmGpu(BaseModel):
        model_config = ConfigDict(extra="ignore")
        physicalId: StrictInt = Field(ge=0, le=1 << 16)
        uuid: StrictStr = Field("", max_length=128)
        pciBusId: StrictStr = Field(max_length=64)
        numNvLinksAvailable: StrictInt = count
        maxNumNvLinks: StrictInt = count
        nvlinkLineRateMBps: StrictInt = count

    class FmPartition(BaseModel):
        model_config = ConfigDict(extra="ignore")
        partitionId: StrictInt = Field(ge=0, le=1 << 16)
        isActive: StrictInt | StrictBool  # fmpm writes 0/1
        numGpus: StrictInt = count
        gpuInfo: list[FmGpu] = Field(max_length=64)

        @model_validator(mode="after")
        def _consistent(self):
            if self.isActive not in (0, 1):
                raise ValueError(f"partition {self.partitionId}: isActive is {self.isActive}, not 0 or 1")
            if self.numGpus != len(self.gpuInfo):
                raise ValueError(f"partition {self.partitionId}: numGpus {self.numGpus} but {len(self.gpuInfo)} gpuInfo entries")
            mods = [g.physicalId for g in self.gpuInfo]
            if len(set(mods)) != len(mods):
                raise ValueError(f"partition {self.partitionId}: a GPU physicalId appears twice")
            return self

    class FmList(BaseModel):
        model_config = ConfigDict(extra="ignore")
        version: StrictInt = Field(ge=0, le=0xFFFFFFFF)
        numPartitions: StrictInt = count
        maxNumPartitions: StrictInt = count
        partitionInfo: list[FmPartition] = Field(max_length=256)

        @model_validator(mode="after")
        def _consistent(self):
            if self.numPartitions != len(self.partitionInfo):
                raise ValueError(f"numPartitions {self.numPartitions} but {len(self.partitionInfo)} partitionInfo entries")
            ids = [p.partitionId for p in self.partitionInfo]
            if len(set(ids)) != len(ids):
                raise ValueError("a partitionId appears twice")
            return self

    class MapGpu(BaseModel):
        model_config = ConfigDict(extra="forbid")
        module: StrictInt = Field(ge=0, le=1 << 16)
        bdf: StrictStr = Field(max_length=64)

    class ModuleMap(BaseModel):
        model_config = ConfigDict(extra="ignore")
        gpus: list[MapGpu] = Field(max_length=256)

    return FmList, ModuleMap


def _read_json(path: str | os.PathLike, what: str) -> object:
    name = os.fspath(path)
    data = read_bounded(name, MAX_FABRIC_BYTES, what, FabricError)
    try:
        return json.loads(data)
    except RecursionError:
        raise FabricError(f"{what} {name}: JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise FabricError(f"{what} {name}: not JSON ({e})") from None


def _validate(model, doc: object, what: str, name: str):
    from pydantic import ValidationError

    try:
        return model.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ())) or "top level"
        raise FabricError(f"{what} {name}: {loc}: {err.get('msg', 'invalid')}") from None


def _map_bdfs(doc, name: str) -> dict[int, Bdf]:
    out: dict[int, Bdf] = {}
    seen: dict[Bdf, int] = {}
    for g in doc.gpus:
        try:
            bdf = normalise_bus_id(g.bdf)
        except MalformedBdfError as e:
            raise FabricError(f"module map {name}: module {g.module}: {e.reason}") from None
        if out.get(g.module, bdf) != bdf or seen.get(bdf, g.module) != g.module:
            raise FabricError(f"module map {name}: module {g.module} / {bdf} mapped twice, differently")
        out[g.module] = bdf
        seen[bdf] = g.module
    return out


def _resolve(fm, module_map: dict[int, Bdf] | None, name: str) -> tuple[tuple[Partition, ...], str]:
    """Partitions with BDFs: the fabric's own where real, else the module map's."""
    used_fabric = used_map = False
    by_module: dict[int, Bdf | None] = {}
    parts = []
    for p in fm.partitionInfo:
        gpus = []
        for g in p.gpuInfo:
            bdf: Bdf | None = None
            if g.pciBusId.strip() not in PLACEHOLDER_BUS_IDS:
                try:
                    bdf = normalise_bus_id(g.pciBusId)
                except MalformedBdfError as e:
                    raise FabricError(f"fabric file {name}: partition {p.partitionId}: {e.reason}") from None
                used_fabric = True
            elif module_map is not None and g.physicalId in module_map:
                bdf = module_map[g.physicalId]
                used_map = True
            if by_module.setdefault(g.physicalId, bdf) != bdf:
                raise FabricError(
                    f"fabric file {name}: module {g.physicalId} is {by_module[g.physicalId]} in one partition "
                    f"and {bdf} in partition {p.partitionId}"
                )
            gpus.append(FabricGpu(g.physicalId, bdf, g.numNvLinksAvailable, g.maxNumNvLinks))
        parts.append(Partition(p.partitionId, bool(p.isActive), tuple(gpus)))
    owners: dict[Bdf, int] = {}
    for m, b in by_module.items():
        if b is not None and owners.setdefault(b, m) != m:
            raise FabricError(f"fabric file {name}: {b} is module {owners[b]} and module {m}")
    source = SOURCE_BOTH if used_fabric and used_map else SOURCE_FABRIC if used_fabric else SOURCE_MAP if used_map else SOURCE_NONE
    return tuple(sorted(parts, key=lambda p: p.id)), source


def load_fabric(path: str | os.PathLike, module_map: str | os.PathLike | None = None, host: Topology | None = None) -> Fabric:
    """Read ``fmpm -l`` output (and, optionally, a module map) into a :class:`Fabric`.

    The fabric file may itself carry a ``gpus`` list (a module map merged into it, so one file,
    e.g. one ConfigMap key, holds both); a separate ``module_map`` file wins over it. With
    ``host``, every BDF must be an NVIDIA GPU of that host."""
    FmList, ModuleMap = _models()
    name = os.fspath(path)
    doc = _read_json(name, "fabric file")
    if not isinstance(doc, dict):
        raise FabricError(f"fabric file {name}: a JSON {type(doc).__name__}, not an object (want the output of `fmpm -l`)")
    fm = _validate(FmList, doc, "fabric file", name)
    mapping: dict[int, Bdf] | None = None
    if "gpus" in doc:
        mapping = _map_bdfs(_validate(ModuleMap, doc, "module map in", name), name)
    if module_map is not None:
        mname = os.fspath(module_map)
        mdoc = _read_json(mname, "module map")
        if not isinstance(mdoc, dict):
            raise FabricError(f'module map {mname}: a JSON {type(mdoc).__name__}, not an object (want {{"gpus": [{{"module", "bdf"}}]}})')
        mapping = _map_bdfs(_validate(ModuleMap, mdoc, "module map", mname), mname)
    parts, source = _resolve(fm, mapping, name)
    fabric = Fabric(parts, source, name)
    if host is not None:
        check_against_host(fabric, host)
    return fabric


def check_against_host(fabric: Fabric, host: Topology) -> None:
    """Every BDF the fabric names must be an NVIDIA GPU on this host (a file from another
    node, or a stale one, must not decide anything)."""
    for p in fabric.partitions:
        for g in p.gpus:
            if g.bdf is None:
                continue
            f = host.find(g.bdf)
            if f is None:
                raise FabricError(
                    f"fabric file {fabric.path}: partition {p.id} module {g.module} is {g.bdf} "
                    f"({fabric.source}), which {host.name} does not have (a file from another node?)"
                )
            if f.vendor != NVIDIA or host.role(f) != Role.GPU:
                raise FabricError(
                    f"fabric file {fabric.path}: partition {p.id} module {g.module} is {g.bdf}, "
                    f"which is a {host.role(f).value} [{f.ids}] on {host.name}, not an NVIDIA GPU"
                )


def modules_text(modules: Iterable[int]) -> str:
    return "{" + ",".join(str(m) for m in sorted(modules)) + "}"


class FabricFile:
    """``--fabric FILE [--module-map FILE]`` for a server that answers many calls: the files are
    re-read when they change (inode, size or mtime), so an operator who activates a partition and
    refreshes the file (a PVC, or a ConfigMap in a new pod) is seen without a restart, and a
    file that is still the same costs one ``stat`` per call. Thread-safe."""

    def __init__(self, path: str | os.PathLike, module_map: str | os.PathLike | None = None, host=None):
        import threading

        self.path = os.fspath(path)
        self.module_map = os.fspath(module_map) if module_map is not None else None
        self._host = host  # a Topology, or a callable returning one
        self._lock = threading.Lock()
        self._key: tuple | None = None
        self._fabric: Fabric | None = None

    def _stamp(self) -> tuple:
        out = []
        for p in (self.path, self.module_map):
            if p is None:
                continue
            try:
                st = os.stat(p)
            except OSError as e:
                raise FabricError(f"cannot read {'fabric file' if p == self.path else 'module map'} {p}: {e.strerror or e}") from None
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def __call__(self) -> Fabric:
        key = self._stamp()
        with self._lock:
            if self._fabric is None or key != self._key:
                host = self._host() if callable(self._host) else self._host
                self._fabric = load_fabric(self.path, self.module_map, host)
                self._key = key
            return self._fabric


def load_nvlink_table(path: str | os.PathLike) -> NvlinkTable:
    """A user's table (JSON ``{"boards": [{"name", "gpus", "links", "nvswitches"}]}``),
    validated with pydantic (imported here only: the sidecar never needs it on this path). It
    lives here, not beside the table in classify.py, so that the classifier stays standard-library
    only for the guest tool (src/pcitopo/cli/guesttool.py)."""
    from pydantic import BaseModel, Field, ValidationError

    class _Board(BaseModel):
        name: str
        gpus: list[str]
        links: int = Field(ge=0, le=64)
        nvswitches: list[str] = []

    class _Table(BaseModel):
        boards: list[_Board]

    try:
        with open(path, "rb") as fh:
            raw = _Table.model_validate(json.load(fh))
    except ValidationError as e:  # name the field, not pydantic's model
        errs = e.errors()
        first = errs[0]
        where = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in first["loc"]).lstrip(".") or "the table"
        more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
        first["msg"] = first["msg"].replace(" or instance of _Table", "").replace(" or instance of _Board", "")
        raise ConfigError(f"NVLink table {os.fspath(path)}: {where}: {first['msg']}{more}; "
                          'want {"boards": [{"name", "gpus": ["10de:2330"], "links", "nvswitches"}]}') from None
    except (OSError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"NVLink table {os.fspath(path)}: {first}") from None
    return NvlinkTable(tuple(NvlinkBoard(b.name, tuple(b.gpus), b.links, tuple(b.nvswitches)) for b in raw.boards))
