"""The demo on any laptop, VM manifests read
like VMIs (2), a dry run that catches a sidecar that is not attached (3), and GPU examples that
are complete and whose "checked against" commands run as written (5, 6, 7). Each test names the
finding it covers; they run the installed console scripts on the fixtures and the shipped files."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pcitopo.host.sources import MemoryTree
from pcitopo.host.sysfs import open_host
from pcitopo.model.cpuinfo import ADDRESS_SIZES_MEMBER
from testkit import REPO as ROOT, fixture_script

BIN = Path(sys.executable).parent
FIXTURES = ROOT / "fixtures"
generate = fixture_script("generate")


def run(cmd: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / cmd), *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def cpuinfo39(tmp_path: Path) -> str:
    """A laptop's /proc/cpuinfo: 39 bits physical (most Intel laptops)."""
    p = tmp_path / "cpuinfo-39"
    p.write_text("processor\t: 0\naddress sizes\t: 39 bits physical, 48 bits virtual\n")
    return str(p)


# -- every fixture carries its node's CPU address width -------------------------------

@pytest.mark.parametrize("name", generate.fixture_names())
def test_every_fixture_records_its_nodes_width(name, tmp_path, monkeypatch):
    """No fixture recorded its node's width, so the running machine's was used. Each
    tarball now holds the `address sizes` line of the CPU its board ships with, whatever machine
    reads it; fixtures/README.md says which CPU and width for each."""
    monkeypatch.setenv("PCITOPO_CPUINFO", cpuinfo39(tmp_path))
    from pcitopo.synth import parse_topo

    topo = FIXTURES / name / "host.topo"
    phys, virt = parse_topo(topo.read_text(), str(topo)).address_bits
    cpu = re.search(r"address width\"\): (.*)$", topo.read_text(), re.M).group(1)
    recorded = MemoryTree.from_tarball(FIXTURES / name / "sysfs.tar.gz").read(ADDRESS_SIZES_MEMBER)
    assert recorded == f"address sizes\t: {phys} bits physical, {virt} bits virtual\n".encode()
    width = open_host(FIXTURES / name).host_width()
    assert width.bits == phys and "recorded in" in width.origin
    readme = (FIXTURES / "README.md").read_text()
    assert f"| `{name}` | {cpu} | {phys} |" in readme


def test_a_capture_of_a_capture_keeps_the_recorded_width(tmp_path):
    """`pcitopo capture --sysfs fixtures/hgx-b200` wrote this machine's width into the
    capture. Now the fixture's recorded width travels, through a capture of the capture too."""
    env = {"PATH": "/usr/bin:/bin", "PCITOPO_CPUINFO": cpuinfo39(tmp_path)}
    first, second = tmp_path / "node.tar.gz", tmp_path / "again.tar.gz"
    for src, out in ((FIXTURES / "hgx-b200", first), (first, second)):
        r = run("pcitopo", "capture", "--sysfs", str(src), "-o", str(out), env=env)
        assert r.returncode == 0, r.stderr
        assert "recorded the host CPU's physical-address width: 52 bits" in r.stderr
        assert MemoryTree.from_tarball(out).read(ADDRESS_SIZES_MEMBER) == b"address sizes\t: 52 bits physical, 57 bits virtual\n"


def test_make_demo_succeeds_under_a_39_bit_cpuinfo(tmp_path):
    """On a 39-bit laptop `make demo` ended "xmlfix: the assigned devices need 5.00 TiB
    of 64-bit MMIO space ... the host CPU has 39 ... Error 2". The whole demo now runs with the
    running machine's cpuinfo pointed at a 39-bit one ($PCITOPO_CPUINFO), the CLI install taken
    as done (-o: the development install is there)."""
    env = {"PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin", "PCITOPO_CPUINFO": cpuinfo39(tmp_path), "HOME": str(tmp_path)}
    r = subprocess.run(["make", "--no-print-directory", "-o", ".venv/.installed-cli", "demo"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "host CPU has 39" not in r.stdout + r.stderr and "Error" not in r.stderr
    assert "host width 52 bits, recorded in" in " ".join(r.stdout.split())


# -- a VirtualMachine's template is read as the VMI it starts --------------------------

B200 = FIXTURES / "hgx-b200"
SIDECAR_LINE = """hooks.kubevirt.io/hookSidecars: '[{"image": "registry.example.com/pcitopo:0.1.0", "imagePullPolicy": "IfNotPresent"}]'"""


def vm_with(tmp_path: Path, *annotations: str, source: str = "deploy/vm-gpu.yaml") -> Path:
    """A copy of a shipped example with more annotations on the VMI's (for a VM: the template's)
    metadata, right after the hookSidecars line."""
    text = (ROOT / source).read_text()
    line = next(x for x in text.splitlines() if x.strip().startswith("hooks.kubevirt.io/hookSidecars:"))
    indent = line[: len(line) - len(line.lstrip())]
    for a in annotations:  # an annotation the example sets already is replaced
        key = a.split(":", 1)[0]
        text = "".join(x for x in text.splitlines(keepends=True) if not x.strip().startswith(key + ":"))
    out = tmp_path / Path(source).name
    out.write_text(text.replace(line + "\n", line + "\n" + "".join(f"{indent}{a}\n" for a in annotations)))
    return out


def xmlfix_check(vmi: Path, *extra: str) -> subprocess.CompletedProcess:
    """The hook door's check of a (changed) copy of an example against that example's domain."""
    domain = B200 / "examples" / Path(vmi).stem / "domain.xml"
    domain = domain if domain.exists() else B200 / "domain.xml"
    return run("xmlfix", "--check", "--door", "hook", "--sysfs", str(B200), "--vmi", str(vmi), *extra, str(domain))


@pytest.mark.parametrize("source", ["deploy/vm-gpu.yaml", "deploy/vmi-gpu.yaml"])
def test_a_vm_template_sets_the_options_as_a_vmi_does(tmp_path, source):
    """`pcitopo.kubevirt.io/mode: "off"` on spec.template.metadata.annotations of a
    copy of deploy/vm-gpu.yaml gave `check: ok`, exit 0; on a VMI it gives unchanged-off, exit 1.
    A VM is now read as the VMI virt-controller starts from it, so both say the same."""
    r = xmlfix_check(vm_with(tmp_path, 'pcitopo.kubevirt.io/mode: "off"', source=source))
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines() == [
        "xmlfix: domain left unchanged (unchanged-off): annotation pcitopo.kubevirt.io/mode is off",
        "xmlfix: check: failed: the hook would not rewrite this domain (unchanged-off)"]


def test_a_vm_as_json_and_its_vmi_are_one_input(tmp_path):
    """`kubectl get vm -o json` is read as the VMI too: its name and namespace are the VM's, its
    annotations, labels and spec the template's (KubeVirt's setupVMIFromVM)."""
    import json

    import yaml

    from pcitopo.kubevirt.manifest import vmi_as_json

    vm = yaml.safe_load((ROOT / "deploy" / "vm-gpu.yaml").read_text())
    vm["spec"]["template"]["metadata"]["labels"] = {"team": "ml"}
    vmi = json.loads(vmi_as_json(json.dumps(vm).encode(), "vm.json"))
    assert vmi["kind"] == "VirtualMachineInstance"
    assert vmi["metadata"] == {**vm["spec"]["template"]["metadata"], "name": "train", "namespace": "ml"}
    assert vmi["spec"] == vm["spec"]["template"]["spec"]
    (tmp_path / "vm.json").write_text(json.dumps(vm))
    vm["spec"]["template"]["metadata"]["annotations"]["pcitopo.kubevirt.io/mode"] = "off"
    (tmp_path / "off.json").write_text(json.dumps(vm))
    assert xmlfix_check(tmp_path / "vm.json").returncode == 0
    off = xmlfix_check(tmp_path / "off.json")
    assert off.returncode == 1 and "unchanged-off" in off.stderr


@pytest.mark.parametrize("doc,said", [
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", "is a Pod: --vmi takes a VirtualMachineInstance or a VirtualMachine"),
    ("apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstanceReplicaSet\nspec: {template: {}}\n",
     "is a VirtualMachineInstanceReplicaSet: --vmi takes"),
    ("apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: v}\nspec: {runStrategy: Always}\n",
     "is a VirtualMachine without spec.template"),
])
def test_other_kinds_are_refused_in_one_line(tmp_path, doc, said):
    f = tmp_path / "thing.yaml"
    f.write_text(doc)
    r = xmlfix_check(f)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1
    assert said in r.stderr and str(f) in r.stderr


def test_options_on_the_vms_own_metadata_are_one_line(tmp_path):
    """KubeVirt copies only the template's annotations: pcitopo's on the VM's own metadata would
    be silently ignored in the cluster, so the dry run says where they belong."""
    text = (ROOT / "deploy" / "vm-gpu.yaml").read_text()
    f = tmp_path / "vm.yaml"
    f.write_text(text.replace("  namespace: ml\nspec:\n",
                              '  namespace: ml\n  annotations:\n    pcitopo.kubevirt.io/mode: "off"\nspec:\n', 1))
    r = xmlfix_check(f)
    assert r.returncode == 2 and r.stderr.splitlines() == [
        f"xmlfix: {f}: annotation pcitopo.kubevirt.io/mode is on the VirtualMachine's own metadata, where KubeVirt "
        "ignores it: move it to spec.template.metadata.annotations"]


# -- the dry run checks that pcitopo is attached ---------------------------------------

NOT_ATTACHED = "; the VM would boot with KubeVirt's own flat placement"
MISSPELT = {
    "no-s": (SIDECAR_LINE.replace("hookSidecars", "hookSidecar"),
             "xmlfix: check: sidecar: not attached: no hooks.kubevirt.io/hookSidecars annotation: "
             "hooks.kubevirt.io/hookSidecar is not an annotation KubeVirt reads (did you mean hooks.kubevirt.io/hookSidecars?)"
             + NOT_ATTACHED),
    "imag": (SIDECAR_LINE.replace('"image"', '"imag"'),
             "xmlfix: check: sidecar: not attached: hooks.kubevirt.io/hookSidecars runs no pcitopo image: entry 0 has no "
             'image (KubeVirt ignores the unknown key "imag": did you mean "image"?), so KubeVirt runs its sidecar-shim there'
             + NOT_ATTACHED),
    "invalid-json": (SIDECAR_LINE.replace("}]'", "}'"),
                     "xmlfix: check: sidecar: not attached: KubeVirt cannot parse hooks.kubevirt.io/hookSidecars: not valid "
                     "JSON (Expecting ',' delimiter at line 1 column 84); virt-controller cannot render the launcher pod "
                     "(its json.Unmarshal fails), so the VM would not start"),
    "other-image": (SIDECAR_LINE.replace("pcitopo:0.1.0", "busybox:1.36"),
                    "xmlfix: check: sidecar: not attached: hooks.kubevirt.io/hookSidecars runs no pcitopo image: entry 0 "
                    "runs registry.example.com/busybox:1.36, not a pcitopo image (give --image if it is pcitopo's)" + NOT_ATTACHED),
    "wrong-type": (SIDECAR_LINE.replace('"IfNotPresent"', "5"),
                   "xmlfix: check: sidecar: not attached: KubeVirt cannot parse hooks.kubevirt.io/hookSidecars: entry 0 "
                   "imagePullPolicy is a number, KubeVirt wants a string; virt-controller cannot render the launcher pod "
                   "(its json.Unmarshal fails), so the VM would not start"),
}


def with_sidecar_line(tmp_path: Path, line: str, source: str = "deploy/vmi-gpu.yaml") -> Path:
    out = tmp_path / Path(source).name
    text = (ROOT / source).read_text()
    assert SIDECAR_LINE in text
    out.write_text(text.replace(SIDECAR_LINE, line))
    return out


@pytest.mark.parametrize("case", list(MISSPELT))
@pytest.mark.parametrize("source", ["deploy/vmi-gpu.yaml", "deploy/vm-gpu.yaml"])
def test_a_sidecar_kubevirt_would_not_run_fails_the_dry_run(tmp_path, case, source):
    """`hookSidecar` (no "s"), `"imag":`, invalid JSON each passed `xmlfix --check
    --vmi` with `check: ok`, and the VM then boots flat and slow with no error. The annotation
    is now read as KubeVirt reads it (its HookSidecar fields, Go's json.Unmarshal) and what is
    wrong is one line; the check fails (exit 1) and names it in its verdict."""
    line, said = MISSPELT[case]
    r = xmlfix_check(with_sidecar_line(tmp_path, line, source))
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0] == said and len(lines) == 2
    assert lines[1].startswith("xmlfix: check: failed: NCCL: 120/120") and lines[1].endswith("; sidecar (above)")


def test_what_kubevirt_accepts_passes():
    """Go's decoder matches keys case-insensitively and ignores unknown ones; an image pinned
    by digest, or pcitopo among other sidecars, is attached."""
    from pcitopo.kubevirt.manifest import HOOK_SIDECARS, attachment

    def verdict(value):
        return attachment({"metadata": {"annotations": {HOOK_SIDECARS: value}}})

    for value in ('[{"Image": "r.example/pcitopo:1"}]', '[{"image": "r.example/x/pcitopo@sha256:00", "extra": 1}]',
                  '[{"image": "busybox"}, {"image": "pcitopo"}]', '[{"image": "r.example:5000/pcitopo"}]'):
        assert verdict(value).attached and verdict(value).door == HOOK_SIDECARS, value
    for value in ("null", "[]", '[{"image": "r.example/pcitopo-not/x:1"}]', '[{"image": "r.example:5000/busybox"}]',
                  '{"image": "pcitopo"}', '[{"image": "pcitopo", "args": [1]}]', '["pcitopo"]', "[NaN]"):
        v = verdict(value)
        assert not v.attached and v.line.startswith("sidecar: not attached: ") and "\n" not in v.line, value
    assert not attachment({}).attached and attachment({}).why == f"no {HOOK_SIDECARS} annotation"
    for near in ("kubevirt.io/hookSidecars", "hooks.kubevirt.io/HookSidecars", "hooks.kubevirt.io/hooksidecar",
                 "hook.kubevirt.io/hookSidecars"):
        v = attachment({"metadata": {"annotations": {near: '[{"image": "pcitopo"}]'}}})
        assert not v.attached and f"{near} is not an annotation KubeVirt reads (did you mean {HOOK_SIDECARS}?)" in v.why
    assert "did you mean" not in attachment({"metadata": {"annotations": {"hooks.kubevirt.io/other": "x"}}}).why


def test_every_shipped_example_is_attached():
    import json

    import yaml

    from pcitopo.kubevirt.manifest import attachment, vmi_as_json

    vms = [(p, d) for p in sorted((ROOT / "deploy").rglob("*.yaml")) for d in yaml.safe_load_all(p.read_text())
           if isinstance(d, dict) and d.get("kind") in ("VirtualMachine", "VirtualMachineInstance")]
    assert len(vms) >= 4
    for path, doc in vms:
        assert attachment(json.loads(vmi_as_json(json.dumps(doc).encode(), path.name))).attached, path


# -- every GPU example is complete: NCCL's topology file, EFI --------------------

def gpu_examples() -> list[tuple[Path, dict]]:
    """Every VM and VMI in deploy/ that is given GPUs, as the VMI it starts."""
    import yaml

    from pcitopo.kubevirt.manifest import as_vmi

    out = []
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") in ("VirtualMachine", "VirtualMachineInstance"):
                vmi = as_vmi(doc, path.name)
                if vmi["spec"]["domain"].get("devices", {}).get("gpus"):
                    out.append((path, vmi))
    return out


GPU_EXAMPLES = gpu_examples()
GPU_IDS = [p.relative_to(ROOT / "deploy").as_posix() for p, _ in GPU_EXAMPLES]


def guest_md_section_4() -> str:
    text = (ROOT / "docs" / "GUEST.md").read_text()
    return text.split("\n## 4. ", 1)[1].split("\n## 5. ", 1)[0]


def guest_md_install_line() -> str:
    """GUEST.md §4's one line (its ```sh block): the one source of the text the examples carry."""
    block = guest_md_section_4().split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [x for x in block.splitlines() if x.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_guest_md_line_is_what_the_hook_offers_and_nccl_reads():
    """The line reads the fw_cfg entry the hook fills and writes where NCCL looks by default;
    GUEST.md's cloud-init block runs exactly that line."""
    import yaml

    from pcitopo.nccl.topoxml import DEFAULT_TOPO_FILE, fwcfg_raw_path

    line = guest_md_install_line()
    assert f"base64 -d {fwcfg_raw_path()} > {DEFAULT_TOPO_FILE}" in line and line.startswith("modprobe qemu_fw_cfg;")
    cloud = yaml.safe_load(guest_md_section_4().split("```yaml\n", 1)[1].split("```", 1)[0])
    assert cloud["bootcmd"] == [["sh", "-c", line]]


def test_every_gpu_example_is_found():
    assert set(GPU_IDS) >= {"vmi-gpu.yaml", "vm-gpu.yaml", "dra/vm-pairs.yaml", "nvlink-fabric.yaml"}


@pytest.mark.parametrize("path,vmi", GPU_EXAMPLES, ids=GPU_IDS)
def test_every_gpu_example_installs_nccls_topology_file(path, vmi):
    """Deploy/vmi-gpu.yaml had only `ssh_authorized_keys: []` in its cloud-init and
    deploy/vm-gpu.yaml none: a copied VM had half the feature (NCCL prices switch uplinks at
    0.19 GB/s). Each GPU example's cloud-init now runs GUEST.md's line from bootcmd, on every
    boot, from a volume attached as a disk."""
    import yaml

    spec = vmi["spec"]
    clouds = [v for v in spec.get("volumes") or [] if "cloudInitNoCloud" in v or "cloudInitConfigDrive" in v]
    assert len(clouds) == 1, path
    disks = {d["name"] for d in spec["domain"]["devices"].get("disks") or []}
    assert clouds[0]["name"] in disks, f"{path}: the cloud-init volume is not attached as a disk"
    source = clouds[0].get("cloudInitNoCloud") or clouds[0]["cloudInitConfigDrive"]
    assert source["userData"].startswith("#cloud-config\n")
    assert ["sh", "-c", guest_md_install_line()] in yaml.safe_load(source["userData"])["bootcmd"]


@pytest.mark.parametrize("path,vmi", GPU_EXAMPLES, ids=GPU_IDS)
def test_every_gpu_example_boots_efi(path, vmi):
    """Deploy/dra/vm-pairs.yaml and deploy/nvlink-fabric.yaml used SeaBIOS, which
    cannot place two large BARs below one switch (8×B200): a B200 user copying the DRA recipe
    got a refused VM. Every GPU example now boots EFI (secure boot off: no SMM needed)."""
    firmware = vmi["spec"]["domain"].get("firmware") or {}
    assert (firmware.get("bootloader") or {}).get("efi") == {"secureBoot": False}, path
    assert "SeaBIOS here" not in path.read_text()


def test_the_dra_recipe_on_a_b200_boots(tmp_path):
    """The DRA recipe, run on the B200 stand-in (two 256 GiB BARs below one switch per pair):
    with EFI the check passes; the same VM under SeaBIOS is the refused VM the finding saw."""
    import json

    from testkit.kubevirt_vmi import domain_for_vmi

    vmi = dict(GPU_EXAMPLES[GPU_IDS.index("dra/vm-pairs.yaml")][1])
    host = open_host(B200)
    gpus = [f.bdf for f in host.functions() if f.vendor == 0x10DE and f.class_code >> 8 == 0x0302][:2]
    for name, efi in (("efi", True), ("seabios", False)):
        doc = json.loads(json.dumps(vmi))
        if not efi:
            del doc["spec"]["domain"]["firmware"]
        (tmp_path / f"{name}.xml").write_bytes(domain_for_vmi(host, doc, gpus))
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    ok = run("xmlfix", "--check", "--sysfs", str(B200), "--vmi", str(tmp_path / "efi.json"), str(tmp_path / "efi.xml"))
    assert ok.returncode == 0, ok.stderr
    refused = run("xmlfix", "--check", "--sysfs", str(B200), "--vmi", str(tmp_path / "seabios.json"), str(tmp_path / "seabios.xml"))
    assert refused.returncode == 2 and "SeaBIOS" in refused.stderr, refused.stderr


# -- every "Checked against" command runs as written ----------------------------------

def checked_against() -> list[tuple[str, str]]:
    """(manifest, command) for every VM/VMI manifest in deploy/ and deploy/dra/: the command on
    the comment line after "Checked against", as written."""
    import re

    import yaml

    out = []
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        text = path.read_text()
        kinds = {d.get("kind") for d in yaml.safe_load_all(text) if isinstance(d, dict)}
        if not kinds & {"VirtualMachine", "VirtualMachineInstance"}:
            continue
        after = text.split("# Checked against", 1)
        assert len(after) == 2, f"{path.name} says nothing it is checked against"
        commands = re.findall(r"^#\s+(xmlfix --check .*?)\s*$", after[1].split("\n\n", 1)[0], re.M)
        assert len(commands) == 1, (path.name, commands)
        out.append((path.relative_to(ROOT).as_posix(), commands[0]))
    return out


CHECKED = checked_against()


def test_every_example_says_what_it_is_checked_against():
    assert {m for m, _ in CHECKED} == {"deploy/dra/vm-pairs.yaml", "deploy/nvlink-fabric.yaml",
                                       "deploy/vm-gpu.yaml", "deploy/vmi-gpu.yaml"}


@pytest.mark.parametrize("manifest,command", CHECKED, ids=[m for m, _ in CHECKED])
def test_the_checked_against_command_runs_as_written(manifest, command):
    """The commands named a domain.xml (and a vmi.yaml) the repository did not have
    (`xmlfix: cannot read domain domain.xml`), and no shipped domain matched nvlink-fabric.yaml's
    two-GPU VMI. Each one now runs verbatim, by a shell, from the repository root, with the
    installed console scripts first on $PATH, and exits 0: the manifest itself is the --vmi, the
    domain is shipped under its fixture (fixtures/examples.py, `make golden`)."""
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": "/nonexistent"}
    r = subprocess.run(["sh", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, (command, r.stderr)
    assert r.stderr.startswith("xmlfix: check: ok: NCCL: "), r.stderr
    assert manifest in command.split()


def test_the_shipped_example_domains_are_what_the_script_writes():
    """The domains follow the simulation of KubeVirt (testkit/kubevirt_vmi.py): `make golden`
    regenerates them; a stale one is named."""
    examples = fixture_script("examples")
    assert [(e.manifest.relative_to(ROOT).as_posix(), e.command) for e in examples.examples()] == CHECKED
    assert examples.main(["--check"]) == 0
