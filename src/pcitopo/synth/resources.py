"""BAR placement: the ``resource`` file of every function and VF of a description,
with the presets' real BAR sizes at addresses a BIOS bump allocator would plausibly pick."""

from __future__ import annotations

from pcitopo.model.bars import Bar, format_resource
from pcitopo.model.tree import Bdf
from pcitopo.synth.looks import VF_BAR, MiB
from pcitopo.synth.spec import DeviceSpec, HostSpec

_ENDPOINT_LINES, _BRIDGE_LINES = 13, 17  # resource lines the kernel prints (6 BARs, ROM, 6 IOV, 4 windows)
_IOV_LINE = 7
_WINDOW_LINES = {"io": (13, 0x101), "m32": (14, 0x200), "p64": (15, 0x102201)}
_WINDOW_ALIGN = {"io": 0x1000, "m32": MiB, "p64": MiB}


def _bar_kind(flags: int) -> str:
    if flags & 0x100:
        return "io"
    return "p64" if flags & 0x2000 and flags & 0x100000 else "m32"


def _align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def _unassigned_bar(dev: DeviceSpec) -> int | None:
    """The BAR the ``bar-unassigned`` fault (src/pcitopo/synth/doctorfiles.py) leaves unplaced: the
    function's largest; None without the fault."""
    if "bar-unassigned" not in dev.look.faults or not dev.look.bars:
        return None  # (the parser refuses the fault on a function without BARs)
    return max(dev.look.bars, key=lambda b: b[1])[0]


class _BarPlacer:
    """Places every BAR the way a BIOS bump allocator would (per kind, in bus-scan order, each
    aligned to its size) and gives bridges windows spanning their subtree: a plausible `resource`
    file for every function, nothing more (the sizes are the facts; addresses are made up)."""

    def __init__(self) -> None:
        self.next = {"io": 0x1000, "m32": 0x80000000, "p64": 0x200000000000}
        self.files: dict[Bdf, str] = {}

    def take(self, kind: str, size: int) -> int:
        base = _align_up(self.next[kind], size)
        self.next[kind] = base + size
        return base

    def device(self, dev: DeviceSpec) -> None:
        lines_n = _BRIDGE_LINES if dev.look.is_bridge else _ENDPOINT_LINES
        for pf_index, bdf in enumerate(dev.function_bdfs()):
            lines = [Bar(i, 0, 0, 0) for i in range(lines_n)]
            unassigned = _unassigned_bar(dev)
            for i, size, flags in dev.look.bars:
                # a BAR the firmware could not place keeps its size at start 0 and takes no space
                base = 0 if i == unassigned else self.take(_bar_kind(flags), size)
                lines[i] = Bar(i, base, base + size - 1, flags)
            if dev.vfs:
                i, size, flags = VF_BAR
                base = self.take(_bar_kind(flags), size * dev.vfs)
                lines[_IOV_LINE] = Bar(_IOV_LINE, base, base + size * dev.vfs - 1, flags)
                for k, (vf, _pf) in enumerate(dev.vf_bdfs()[pf_index * dev.vfs:(pf_index + 1) * dev.vfs]):
                    vf_lines = [Bar(j, 0, 0, 0) for j in range(_ENDPOINT_LINES)]
                    vf_lines[i] = Bar(i, base + k * size, base + (k + 1) * size - 1, flags)
                    self.files[vf] = format_resource(vf_lines)
            if dev.look.is_bridge and bdf == dev.bdf:
                self.windows(dev, lines)
            self.files[bdf] = format_resource(lines)

    def windows(self, dev: DeviceSpec, lines: list[Bar]) -> None:
        for kind, a in _WINDOW_ALIGN.items():
            self.next[kind] = _align_up(self.next[kind], a)
        lo = dict(self.next)
        for child in sorted(dev.children, key=lambda c: c.bdf):
            self.device(child)
        for kind, (i, flags) in _WINDOW_LINES.items():
            self.next[kind] = _align_up(self.next[kind], _WINDOW_ALIGN[kind])
            if self.next[kind] > lo[kind]:
                lines[i] = Bar(i, lo[kind], self.next[kind] - 1, flags)


def place_bars(spec: HostSpec) -> dict[Bdf, str]:
    """The `resource` file text of every function (and VF) of a description."""
    placer = _BarPlacer()
    for root in sorted(spec.roots, key=lambda r: (r.domain, r.bus)):
        for child in sorted(root.children, key=lambda c: c.bdf):
            placer.device(child)
    return placer.files
