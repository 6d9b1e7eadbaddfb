"""deploy/ and DEPLOY.md's deploy steps as an operator follows them:
every shipped VM boots what its node can map, names the feature gates it needs, and the doctor's
namespace admits the doctor."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from pcitopo.host.sysfs import open_host
from testkit import REPO as ROOT, fixture_script
from testkit.kubevirt_vmi import VM_KINDS, as_vmi, domain_for_vmi
from testkit.server_proc import BIN

DEPLOY = ROOT / "deploy"
DOCS = ROOT / "docs" / "DEPLOY.md"
# The comment line in each VM example that says which stand-in node it is checked against.
CHECK_LINE = re.compile(r"^#\s+xmlfix --check (?P<args>.*?)\s*$", re.M)


def manifests() -> list[tuple[Path, int, dict]]:
    out = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if isinstance(doc, dict) and doc.get("kind") in VM_KINDS:
                out.append((path, i, doc))
    return out


VMS = manifests()
VM_IDS = [p.name for p, _, _ in VMS]


def check_args(path: Path) -> dict[str, str]:
    m = CHECK_LINE.search(path.read_text())
    assert m, f"{path.name} names no stand-in node (a comment line `#   xmlfix --check --sysfs fixtures/NAME ...`)"
    words = m["args"].split()
    return {words[i]: words[i + 1] for i in range(0, len(words) - 1) if words[i].startswith("--")}


# The GPUs of the fabric's active partition of a VMI's GPU count (fixtures/examples.py, which
# writes the domains the examples' commands name, picks them the same way).
active_partition = fixture_script("examples").active_partition


def test_every_vm_example_is_found():
    assert {p.name for p, _, _ in VMS} >= {"vm-gpu.yaml", "vmi-gpu.yaml", "nvlink-fabric.yaml"}


@pytest.mark.parametrize("path,index,doc", VMS, ids=VM_IDS)
def test_every_vm_example_passes_xmlfix_check_on_its_node(tmp_path, path, index, doc):
    """Each VM/VMI in deploy/ passes `xmlfix --check` against the fixture it names
    (the 8×B200 examples booted SeaBIOS, which cannot map two 256 GiB BARs below one switch:
    exit 2 under on-error: fail, i.e. a VM that does not start)."""
    args = check_args(path)
    sysfs = ROOT / args["--sysfs"]
    host = open_host(sysfs)
    vmi = as_vmi(doc)
    gpus = None
    cmd = [str(BIN / "xmlfix"), "--check", "--sysfs", str(sysfs)]
    if "--fabric" in args:
        fabric = ROOT / args["--fabric"]
        gpus = active_partition(fabric, len(vmi["spec"]["domain"]["devices"]["gpus"]))
        cmd += ["--fabric", str(fabric)]
    (tmp_path / "domain.xml").write_bytes(domain_for_vmi(host, vmi, gpus))
    (tmp_path / "vmi.json").write_text(json.dumps(vmi))
    r = subprocess.run([*cmd, "--vmi", str(tmp_path / "vmi.json"), str(tmp_path / "domain.xml")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("path,index,doc", VMS, ids=VM_IDS)
def test_efi_examples_are_admissible(path, index, doc):
    """KubeVirt's admission refuses EFI with secure boot (its default) unless the SMM
    feature is on; an example with EFI either turns secure boot off or turns SMM on."""
    domain = as_vmi(doc)["spec"]["domain"]
    efi = ((domain.get("firmware") or {}).get("bootloader") or {}).get("efi")
    if efi is None:
        return
    smm = (domain.get("features") or {}).get("smm")
    assert efi.get("secureBoot") is False or (smm is not None and smm.get("enabled", True)), path.name


# -- feature gates -------------------------------------------------------------------

def gates_needed(vmi: dict) -> set[str]:
    """The alpha feature gates KubeVirt v1.6 to main checks for what this VMI uses (NUMA and GPU
    are GA since v1.4 and need none)."""
    spec = vmi["spec"]["domain"]
    need = set()
    if "hooks.kubevirt.io/hookSidecars" in (vmi["metadata"].get("annotations") or {}):
        need.add("Sidecar")
    if (spec.get("cpu") or {}).get("dedicatedCpuPlacement"):
        need.add("CPUManager")
    if (spec.get("devices") or {}).get("hostDevices"):
        need.add("HostDevices")
    return need


def listed_gates(path: Path) -> set[str]:
    m = re.search(r"^# Feature gates \(KubeVirt v1\.6 to main\): (.*)$", path.read_text(), re.M)
    assert m, f"{path.name} does not list the feature gates it needs"
    return {g.strip(" .") for g in m[1].split(",")}


@pytest.mark.parametrize("path,index,doc", VMS, ids=VM_IDS)
def test_each_example_names_the_feature_gates_it_needs(path, index, doc):
    """The gates an example needs are in its comments and in deploy/kubevirt-cr.yaml."""
    need = gates_needed(as_vmi(doc))
    assert listed_gates(path) == need
    cr = yaml.safe_load((DEPLOY / "kubevirt-cr.yaml").read_text())
    assert need <= set(cr["spec"]["configuration"]["developerConfiguration"]["featureGates"])


def test_deploy_md_lists_the_gates_of_every_example():
    text = DOCS.read_text()
    for _path, _, doc in VMS:
        for gate in gates_needed(as_vmi(doc)):
            assert f"`{gate}`" in text, gate


# -- the doctor's namespace ------------------------------------------------------------

def test_doctor_namespace_admits_a_privileged_pod():
    """The doctor uses hostPath volumes and adds CAP_SYS_ADMIN, which Pod Security's
    "baseline" and "restricted" levels reject; its namespace says "privileged" for all three modes."""
    ns = next(d for d in yaml.safe_load_all((DEPLOY / "base" / "namespace.yaml").read_text()) if d)
    ds = next(d for d in yaml.safe_load_all((DEPLOY / "base" / "doctor.yaml").read_text()) if d)
    assert ds["metadata"]["namespace"] == ns["metadata"]["name"]
    pod = ds["spec"]["template"]["spec"]
    assert any("hostPath" in v for v in pod["volumes"])
    assert any("SYS_ADMIN" in c["securityContext"]["capabilities"].get("add", []) for c in pod["containers"])
    labels = ns["metadata"].get("labels") or {}
    for mode in ("enforce", "audit", "warn"):
        assert labels.get(f"pod-security.kubernetes.io/{mode}") == "privileged", mode


# -- shell snippets that change directory ------------------------------------------------

def shell_blocks(text: str) -> list[str]:
    return re.findall(r"```(?:sh|bash|console)\n(.*?)```", text, re.S)


def paths_after_cd(block: str) -> list[str]:
    """Arguments that name a directory the block has already changed into (`cd deploy && …`
    followed by `… deploy/`)."""
    wrong, cwd = [], None
    for line in block.splitlines():
        m = re.match(r"\s*cd\s+(\S+?)/?(\s|&&|;|$)", line)
        if m:
            cwd = m[1]
            line = line[m.end():]
        if cwd and re.search(rf"(^|\s){re.escape(cwd)}/?(\s|$)", line):
            wrong.append(line.strip())
    return wrong


def test_the_paths_finder_sees_the_old_snippet():
    assert paths_after_cd("cd deploy && kustomize edit set image x\nkubectl kustomize deploy/ | grep y\n")


@pytest.mark.parametrize("doc", ["docs/DEPLOY.md", "docs/OPERATOR.md", "docs/CLI.md", "README.md"])
def test_snippets_do_not_name_the_directory_they_cd_into(doc):
    """`cd deploy && kustomize edit …` followed by `kubectl kustomize deploy/` pointed
    at deploy/deploy/."""
    wrong = [w for b in shell_blocks((ROOT / doc).read_text()) for w in paths_after_cd(b)]
    assert wrong == []


# -- NFD and the tested-with table ------------------------------------------------------

def test_nfd_extra_label_ns_advice_names_the_versions_that_need_it():
    """Nfd-master publishes any namespace outside kubernetes.io since NFD v0.13; only
    v0.12 and earlier need -extra-label-ns."""
    text = "\n\n".join(p.read_text() for p in sorted(DOCS.parent.glob("*.md")))
    para = next(p for p in text.split("\n\n") if "extra-label-ns" in p or "extraLabelNs" in p)
    assert "v0.13" in para and "v0.12" in para


def test_tested_with_table_says_what_was_and_was_not_tested():
    """The versions the e2e tier boots, the KubeVirt releases whose re-parse is
    simulated, and that no real cluster was used."""
    text = DOCS.read_text()
    section = text[text.index("### What was tested, and what was not"):]
    section = section[:section.index("\n### ", 4)]
    for needle in ("QEMU 10.0.13", "libvirt 11.3.0", "SeaBIOS 1.16.3", "OVMF 2025.02", "v1.7", "v1.8 to v1.9",
                   "main", "simulated", "**not tested**"):
        assert needle in section, needle
