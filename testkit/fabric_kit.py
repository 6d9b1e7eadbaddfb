"""Test kit for the NVLink fabric tests: domains holding a chosen GPU set, VMI JSON with the
nvlink option, and the fabric fixtures by name."""

from __future__ import annotations

import json

from lxml import etree

from . import REPO

# Module ID -> (GPU bus, its PIX NIC's bus) on the fixtures (fixtures/fabric_gen.py scrambles them).
H100 = {1: ("2a", "29"), 2: ("5d", "5c"), 3: ("18", "19"), 4: ("3a", "3b"),
        5: ("ab", "aa"), 6: ("db", "da"), 7: ("9a", "9b"), 8: ("ba", "bb")}
B200 = {1: ("3c", "3d"), 2: ("1a", "1b"), 3: ("40", "41"), 4: ("1e", "1f"),
        5: ("bc", "bd"), 6: ("9c", "9d"), 7: ("c0", "c1"), 8: ("a0", "a1")}
BOARDS = {"hgx-h100": H100, "hgx-b200": B200}


def fabric(board: str, variant: str = "active") -> str:
    name = "fmpm-l.json" if variant == "default" else f"fmpm-l-{variant}.json"
    return str(REPO / "fixtures" / board / "fabric" / name)


def module_map(board: str) -> str:
    return str(REPO / "fixtures" / board / "fabric" / "module-map.json")


def domain_with_modules(board: str, modules: set[int], nics: bool = True) -> bytes:
    """The fixture's golden input domain with only the hostdevs of these modules' GPUs (and
    their NICs): what KubeVirt hands the hook for a VM given that GPU set."""
    keep = set()
    for m in modules:
        gpu, nic = BOARDS[board][m]
        keep.add(int(gpu, 16))
        if nics:
            keep.add(int(nic, 16))
    root = etree.fromstring((REPO / "fixtures" / board / "domain.xml").read_bytes())
    for hd in root.findall("devices/hostdev"):
        addr = hd.find("source/address")
        if int(addr.get("bus"), 16) not in keep:
            hd.getparent().remove(hd)
    return etree.tostring(root)


def vmi_with(nvlink: str | None) -> bytes:
    ann = {} if nvlink is None else {"pcitopo.kubevirt.io/nvlink": nvlink}
    # the golden domains' VMI (their <name> is default_gpu-all: xmlfix warns on another VMI)
    # (and the label the pcitopo Plugin selects: a VMI no door attaches fails --check)
    return json.dumps({"metadata": {"name": "gpu-all", "namespace": "default", "annotations": ann,
                                    "labels": {"pcitopo.kubevirt.io/plugin": "true"}}}).encode()
