"""KubeVirt's DRA metadata files (KEP-5304) as kubelet writes them and virt-launcher reads them
back, for tests that run that path (``pkg/dra/utils.go``: ``{base}/resourceclaimtemplates/{claim}/
{request}/{driver}-metadata.json``, apiVersion ``metadata.resource.k8s.io/v1alpha1``,
``pkg/dra/metadata/types.go``); what the converter writes is the product's one model of it,
:mod:`pcitopo.kubevirt.launcher.converter`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pcitopo.kubevirt.launcher.allocation import device_requests
from pcitopo.kubevirt.launcher.converter import is_dra as _is_dra
from pcitopo.model.tree import Bdf

# pkg/dra/utils.go, pkg/dra/metadata/types.go (KEP-5304).
DRA_METADATA_API = "metadata.resource.k8s.io/v1alpha1"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
DRA_TEMPLATES = "resourceclaimtemplates"


def hostdev_aliases(vmi: dict[str, Any]) -> list[str]:
    """The aliases of the VMI's hostdevs (GPUs, then SR-IOV interfaces, then host devices), as
    the product's converter names them."""
    return [r.alias for r in device_requests(vmi["spec"]["domain"].get("devices", {}))]


def write_dra_metadata(base: Path, vmi: dict[str, Any], devices: Sequence[Bdf], driver: str = "gpu.example.com") -> None:
    """The KEP-5304 files kubelet writes for the VMI's DRA requests (one device per request), in
    the order :func:`hostdev_aliases` lists them."""
    spec = vmi["spec"]["domain"].get("devices", {})
    entries = list(spec.get("gpus") or []) + [i for i in spec.get("interfaces") or [] if "sriov" in i]
    entries += list(spec.get("hostDevices") or [])
    for entry, bdf in zip(entries, devices):
        if not _is_dra(entry):
            continue
        d = base / DRA_TEMPLATES / entry["claimName"] / entry["requestName"]
        d.mkdir(parents=True, exist_ok=True)
        doc = {"apiVersion": DRA_METADATA_API, "kind": "DeviceMetadata", "podClaimName": entry["claimName"],
               "requests": [{"name": entry["requestName"], "devices": [
                   {"driver": driver, "pool": "node-a", "name": f"dev-{bdf}",
                    "attributes": {PCI_BUS_ID: {"string": str(bdf)}}}]}]}
        (d / f"{driver}-metadata.json").write_text(json.dumps(doc))


def dra_pci_address(base: Path, claim: str, request: str) -> Bdf:
    """pkg/dra/utils.go GetPCIAddressForClaim for a template claim: the one metadata file of the
    request, the first object of a supported apiVersion, its one device's pciBusID."""
    (path,) = sorted((base / DRA_TEMPLATES / claim / request).glob("*-metadata.json"))
    dec, text, pos = json.JSONDecoder(), path.read_text(), 0
    while pos < len(text):
        doc, pos = dec.raw_decode(text, pos)
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if doc.get("apiVersion") == DRA_METADATA_API:
            (req,) = [r for r in doc["requests"] if r["name"] == request]
            (device,) = req["devices"]
            return Bdf.parse(device["attributes"][PCI_BUS_ID]["string"])
    raise ValueError(f"{path}: no {DRA_METADATA_API} object")


def dra_sources(base: Path, vmi: dict[str, Any]) -> list[Bdf | None]:
    """Per hostdev (in :func:`hostdev_aliases` order) the address DRA's metadata gives, None for
    a device-plugin one."""
    spec = vmi["spec"]["domain"].get("devices", {})
    entries = list(spec.get("gpus") or []) + [i for i in spec.get("interfaces") or [] if "sriov" in i]
    entries += list(spec.get("hostDevices") or [])
    return [dra_pci_address(base, e["claimName"], e["requestName"]) if _is_dra(e) else None for e in entries]
