"""Synthetic hosts: a short indented description (``.topo``) → a tree laid out like ``/sys``.

The format is documented in ``fixtures/README.md``. In short::

    numa 0 cpus=0-55,112-167
    rc 0000:15 numa=0
      rp 15:01.0 preset=intel-rp
        us 16:00.0 preset=pex-gen5-oem
          ds 17:00.0
            ep 18:00.0 preset=h100

The builder writes exactly what the kernel shows (relative ``bus/pci/devices`` links, one
directory per function nested along the PCI hierarchy, attribute files with the kernel's
formatting) and nothing else: only the attribute names :mod:`pcitopo.host.sysfs` reads.

The pieces, in the order the data flows: :mod:`.looks` (presets, BAR sizes), :mod:`.spec` (the
parsed description), :mod:`.parse` (``.topo`` text → spec), :mod:`.bars` (``resource`` files),
:mod:`.build` (spec → tree). Importers use the names below: ``from pcitopo.synth import X``.
"""

from __future__ import annotations

from pcitopo.synth.build import build_tree, host_from_topo, load_topo_file
from pcitopo.synth.looks import PRESETS, Look
from pcitopo.synth.parse import parse_topo
from pcitopo.synth.spec import DeviceSpec, HostSpec, NumaSpec, RootSpec, TopoError, format_cpus

__all__ = [
    "DeviceSpec", "HostSpec", "Look", "NumaSpec", "PRESETS", "RootSpec", "TopoError",
    "build_tree", "format_cpus", "host_from_topo", "load_topo_file", "parse_topo",
]
