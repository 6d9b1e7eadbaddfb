"""Whether a host model still describes the host it was read from.

A long-running reader (``pcitopo serve``) keeps one host model and answers every call from it.
Most of what the model holds does not change while the host runs: the PCI tree, ids, NUMA
nodes. Three things do, and each is checked here against the source, cheaply enough to do on
every call:

- a rebind: the device's ``driver`` link (``vfio-pci`` <-> a host driver);
- an IOMMU group change: the device's ``iommu_group`` link;
- a new capture: the file or directory ``--sysfs`` names was replaced (its identity changed).

The checks read the links afresh from the source (never from the reader's remembered links)
and compare them with what the model holds.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from pcitopo.host.sources import PCI_DEVICES_DIR, resolve
from pcitopo.model.keep import PerModel
from pcitopo.model.tree import Bdf, Topology

# (device, inode, size, mtime) of what ``--sysfs`` names; None where it cannot be stat'ed.
Identity = tuple[int, int, int, int] | None


def capture_identity(path: str | os.PathLike) -> Identity:
    """The identity of what ``open_source(path)`` reads: the capture tarball (a fixture
    directory's ``sysfs.tar.gz``) or the directory itself. A new capture written in place or
    renamed over the old one changes it; ``/sys`` keeps one for the life of the host."""
    p = os.fspath(path)
    inner = os.path.join(p, "sysfs.tar.gz")
    try:
        st = os.stat(inner if os.path.isdir(p) and os.path.isfile(inner) else p)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _link_name(target: str | None) -> str | None:
    return target.rstrip("/").rsplit("/", 1)[-1] if target else None


# Each device's directory, through the reader's links, per host model: the bus/pci/devices link
# of an existing device never moves.
_DEVICE_DIRS: PerModel[dict[Bdf, str]] = PerModel(lambda topo: {})


def changed_devices(topo: Topology, bdfs: Iterable[Bdf]) -> list[str]:
    """The devices among ``bdfs`` whose driver or IOMMU group in the source differs from the
    model's (a rebind, a group change), each with what changed; empty when the model is
    current for them. A device the model does not know is not judged here."""
    loader = topo.loader
    source = getattr(loader, "source", None)
    if source is None:  # not read from sysfs (a model built in memory): nothing can change under it
        return []
    # The device's directory through the reader's remembered links (the bus/pci/devices link
    # of an existing device never moves); the two links inside it are read afresh.
    links = loader if hasattr(loader, "readlink") else source
    out = []
    for bdf in bdfs:
        f = topo.find(bdf)
        if f is None:
            continue
        dirs = _DEVICE_DIRS(topo)
        base = dirs.get(f.bdf)
        if base is None:
            base = dirs[f.bdf] = resolve(links, f"{PCI_DEVICES_DIR}/{f.bdf}")
        driver = _link_name(source.readlink(f"{base}/driver"))
        group_name = _link_name(source.readlink(f"{base}/iommu_group"))
        group = int(group_name) if group_name and group_name.isdigit() else None
        if driver != f.driver:
            out.append(f"{bdf} driver {f.driver or 'none'} -> {driver or 'none'}")
        if group != f.iommu_group:
            out.append(f"{bdf} IOMMU group {f.iommu_group} -> {group}")
    return out


__all__ = ["Identity", "capture_identity", "changed_devices"]
