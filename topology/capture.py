"""`pcitopo capture`: snapshot exactly what the reader needs from a host, nothing else.

The result is a deterministic ``.tar.gz`` that :func:`topology.sysfs.open_host` reads back into
the same model, so an operator can attach a host to a bug report and anyone can replay it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import SysfsError
from .sysfs import (
    LINK_ATTRS,
    NODE_ATTRS,
    NODE_DIR,
    OPTIONAL_ATTRS,
    PCI_DEVICES_DIR,
    REQUIRED_ATTRS,
    RESOURCE_ATTRS,
    MemoryTree,
    Source,
    Unreadable,
    open_source,
    resolve,
)


@dataclass(frozen=True, slots=True)
class CaptureSummary:
    functions: int
    numa_nodes: int
    entries: int
    skipped: tuple[str, ...]


def capture_tree(source: Source) -> tuple[MemoryTree, CaptureSummary]:
    tree = MemoryTree(f"capture of {source.name}")
    skipped: list[str] = []
    names = source.listdir(PCI_DEVICES_DIR)
    if names is None:
        raise SysfsError(f"{source.name}: {PCI_DEVICES_DIR} is not a directory")
    functions = 0
    for name in sorted(names):
        link = f"{PCI_DEVICES_DIR}/{name}"
        target = source.readlink(link)
        if target is None:
            skipped.append(f"{link}: not a symlink")
            continue
        real = resolve(source, link)
        tree.add_link(link, target)
        tree.add_dir(real)
        functions += 1
        for attr in REQUIRED_ATTRS + OPTIONAL_ATTRS + RESOURCE_ATTRS:
            data = source.read(f"{real}/{attr}")
            if data is None:
                continue
            if isinstance(data, Unreadable):
                skipped.append(f"{real}/{attr}: {data.why}")
                continue
            tree.add_file(f"{real}/{attr}", data)
        for attr in LINK_ATTRS:
            t = source.readlink(f"{real}/{attr}")
            if t is not None:
                tree.add_link(f"{real}/{attr}", t)
    nodes = 0
    for n in sorted(source.listdir(NODE_DIR) or []):
        if not (n.startswith("node") and n[4:].isdigit()):
            continue
        nodes += 1
        tree.add_dir(f"{NODE_DIR}/{n}")
        for attr in NODE_ATTRS:
            data = source.read(f"{NODE_DIR}/{n}/{attr}")
            if isinstance(data, bytes):
                tree.add_file(f"{NODE_DIR}/{n}/{attr}", data)
    return tree, CaptureSummary(functions, nodes, len(tree), tuple(skipped))


def capture(sysfs: str | os.PathLike, out: str | os.PathLike) -> CaptureSummary:
    tree, summary = capture_tree(open_source(sysfs))
    try:
        tree.write_tarball(out)
    except OSError as e:
        raise SysfsError(f"cannot write {os.fspath(out)}: {e.strerror or e}") from None
    return summary
