"""The shipped examples (``deploy/*.yaml``) and their stand-in nodes, and the domain the tests give
them: test scaffolding around the product's prediction (:mod:`pcitopo.kubevirt.launcher.first_domain`,
what ``pcitopo domain`` prints), which is the one model of KubeVirt's converter.

:func:`domain_for_vmi` asks the product for the first hook input with the pod's CPUs as kubelet
gives them under the settings docs/DEPLOY.md recommends (what the examples' golden domains
assume, fixtures/examples.py) and, given ``gpus`` (e.g. one fabric partition), those GPUs for the
first GPU requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pcitopo.kubevirt.launcher.converter import UPSTREAM_MACHINE
from pcitopo.kubevirt.launcher.first_domain import Inputs, predict
from pcitopo.kubevirt.launcher.release_groups import Release
from pcitopo.kubevirt.manifest import as_vmi as _as_vmi
from pcitopo.model.tree import Bdf, Topology

VM_KINDS = ("VirtualMachine", "VirtualMachineInstance")


def as_vmi(doc: dict[str, Any]) -> dict[str, Any]:
    """The VMI a manifest starts (src/pcitopo/kubevirt/manifest.py's reading)."""
    return _as_vmi(doc, str(doc.get("metadata", {}).get("name", "manifest")))


def domain_for_vmi(host: Topology, vmi: dict[str, Any], gpus: Sequence[Bdf] | None = None,
                   release: Release = Release.V1_9, machine: str = UPSTREAM_MACHINE) -> bytes:
    """KubeVirt's first ``OnDefineDomain`` input for ``vmi`` on ``host`` (before placeholders,
    :func:`testkit.kubevirt_define.with_placeholders`), as ``release`` converts it."""
    inputs = Inputs(release=release, version=release.model_tag, machine=machine, devices=tuple(gpus or ()))
    return predict(host, vmi, inputs).xml


def deploy_examples(repo: Path) -> list[tuple[str, Topology, dict[str, Any], list[Bdf] | None]]:
    """Every VM/VMI of deploy/ with the stand-in node its ``# xmlfix --check`` comment names and,
    for a fabric example, the active partition's GPUs: (file name, host, VMI, GPUs or None)."""
    import json
    import re

    import yaml

    from pcitopo.host.sysfs import open_host

    out = []
    for path in sorted((repo / "deploy").rglob("*.yaml")):
        words = re.search(r"^#\s+xmlfix --check (.*?)\s*$", path.read_text(), re.M)
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") not in VM_KINDS or words is None:
                continue
            w = words[1].split()
            args = {w[i]: w[i + 1] for i in range(len(w) - 1) if w[i].startswith("--")}
            vmi = as_vmi(doc)
            gpus = None
            if "--fabric" in args:
                size = len(vmi["spec"]["domain"]["devices"]["gpus"])
                data = json.loads((repo / args["--fabric"]).read_text())
                (part,) = [p for p in data["partitionInfo"] if p["isActive"] and p["numGpus"] == size]
                gpus = [Bdf.parse(g["pciBusId"][4:]) for g in part["gpuInfo"]]
            out.append((path.name, open_host(repo / args["--sysfs"]), vmi, gpus))
    return out
