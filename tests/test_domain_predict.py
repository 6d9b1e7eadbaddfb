"""``pcitopo domain`` and ``xmlfix --vmi`` without a domain: the domain KubeVirt's virt-launcher
would hand the hook, predicted from a manifest and a node capture (pcitopo.kubevirt.launcher)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from lxml import etree

from pcitopo.errors import ConfigError
from pcitopo.kubevirt.launcher.release_groups import Release, release_of
from testkit import REPO as ROOT, fixture_script

BIN = Path(sys.executable).parent
EXAMPLES = fixture_script("examples")
B200, H100, B300, SRIOV = (str(ROOT / "fixtures" / n) for n in ("hgx-b200", "hgx-h100", "hgx-b300", "sriov-4k"))
VM_GPU = str(ROOT / "deploy" / "vm-gpu.yaml")


def run(tool: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / tool), *args], cwd=ROOT, capture_output=True, timeout=180, input=stdin,
                          text=stdin is not None)


def domain(*args: str) -> tuple[etree._Element, str]:
    r = run("pcitopo", "domain", *args)
    assert r.returncode == 0, r.stderr
    return etree.fromstring(r.stdout), r.stderr.decode()


def sources(root: etree._Element) -> list[tuple[str, str]]:
    """(alias, host BDF) of every hostdev, in order."""
    out = []
    for hd in root.iter("hostdev"):
        a = hd.find("source/address")
        bdf = f"{int(a.get('domain'), 16):04x}:{int(a.get('bus'), 16):02x}:{int(a.get('slot'), 16):02x}.{int(a.get('function'), 16)}"
        out.append((hd.find("alias").get("name"), bdf))
    return out


def memnodes(root: etree._Element) -> list[str]:
    return [m.get("nodeset") for m in root.iter("memnode")]


@pytest.mark.parametrize("example", EXAMPLES.examples(), ids=lambda e: e.manifest.name)
def test_each_deploy_example_predicts_the_domain_its_comment_checks(example):
    """Done when: `pcitopo domain` on the example's stand-in node prints the very domain its
    "Checked against" command names, and `xmlfix --check --vmi` runs on a predicted one."""
    command = EXAMPLES.domain_command(example)
    stated = "#   pcitopo " + " ".join(str(a) for a in command) + "\n"
    assert stated in (ROOT / example.vmi).read_text(), f"{example.vmi}'s comment should state: {stated}"
    r = run("pcitopo", *command)
    assert r.returncode == 0, r.stderr
    assert r.stdout == example.domain.read_bytes()
    given = EXAMPLES.domain_command(example)[1:]
    fabric = ["--fabric", example.fabric] if example.fabric else []
    check = run("xmlfix", "--check", *given, *fabric)
    assert check.returncode in (0, 1), check.stderr
    first = check.stderr.decode().splitlines()[0]
    assert "domain predicted" in first and "KubeVirt v1.9.0" in first


def vm_with_cores(tmp_path, cores: int) -> str:
    """deploy/vm-gpu.yaml asking for ``cores`` cores per socket (2 sockets, 2 threads)."""
    import yaml

    vm = yaml.safe_load((ROOT / VM_GPU).read_text())
    vm["spec"]["template"]["spec"]["domain"]["cpu"]["cores"] = cores
    return write(tmp_path, f"vm-{cores}.yaml", vm)


def test_default_settings_give_the_cells_kubelet_gives(tmp_path):
    """64 vCPUs + the emulator thread on hgx-b200 (4 × 56 CPUs, CPUs 0 and 112 reserved), kubelet
    v1.33's cpu_assignment.go under best-effort: distribute-cpus-across-numa takes the fewest
    nodes, 2, and of those the best balance score, nodes 1 and 2 (33 + 32); packed takes node 1
    whole and 9 from node 0; `devices` (not kubelet's) spreads them over all four."""
    vm64 = vm_with_cores(tmp_path, 16)
    root, err = domain("--vmi", vm64, "--sysfs", B200)
    assert memnodes(root) == ["1", "2"]
    assert "kubelet assumed: cpuManagerPolicyOptions distribute-cpus-across-numa" in err
    assert "65 (33 on node 1, 32 on node 2)" in err and "reserved CPUs 0,112" in err
    assert [len(etree_cpus(c)) for c in root.iter("cell")] == [32, 32]  # node 1's odd CPU is the emulator's
    assert root.find("cputune/emulatorpin").get("cpuset") not in {p.get("cpuset") for p in root.iter("vcpupin")}
    packed, err = domain("--vmi", vm64, "--sysfs", B200, "--cpu-policy", "packed")
    assert memnodes(packed) == ["0", "1"] and "65 (9 on node 0, 56 on node 1)" in err
    spread, _ = domain("--vmi", vm64, "--sysfs", B200, "--cpu-policy", "devices")
    assert memnodes(spread) == ["0", "1", "2", "3"]
    example, _ = domain("--vmi", VM_GPU, "--sysfs", B200)  # 168 vCPUs: all four nodes
    assert memnodes(example) == ["0", "1", "2", "3"]


def etree_cpus(cell) -> set[int]:
    from pcitopo.libvirt.domain import parse_cpuset

    return parse_cpuset(cell.get("cpus"))


@pytest.mark.parametrize("policy", ["restricted", "single-numa-node"])
def test_a_pod_kubelet_refuses_gets_kubelets_reason_not_a_domain(tmp_path, policy):
    """GPUs on 4 nodes, 65 CPUs that fit in 2: no preferred merged hint, kubelet's
    TopologyAffinityError; the check fails the same way (exit 1)."""
    vm64 = vm_with_cores(tmp_path, 16)
    for tool, args in (("pcitopo", ["domain"]), ("xmlfix", ["--check"])):
        r = run(tool, *args, "--vmi", vm64, "--sysfs", B200, "--topology-policy", policy)
        last = r.stderr.decode().splitlines()[-1]
        assert r.returncode == 1 and not r.stdout, r.stderr
        assert "kubelet refuses the pod at admission" in last and "TopologyAffinityError" in last, last
    ok = run("pcitopo", "domain", "--vmi", VM_GPU, "--sysfs", B200, "--topology-policy", "restricted")
    assert ok.returncode == 0, ok.stderr  # 169 CPUs need all four nodes: the hints agree


def test_the_check_names_the_smallest_vcpu_count_that_gives_every_gpu_node_a_cell(tmp_path):
    r = run("xmlfix", "--check", "--vmi", vm_with_cores(tmp_path, 16), "--sysfs", B200)
    assert r.returncode == 1
    line = next(x for x in r.stderr.decode().splitlines() if "have no guest cell (" in x)
    assert "here nodes 1,2 only" in line and "give the VM 168 vCPUs (169 pod CPUs with the emulator thread)" in line
    none = run("xmlfix", "--check", "--vmi", vm_with_cores(tmp_path, 16), "--sysfs", B200, "--cpu-policy", "packed",
               "--reserved-cpus", "0-55,112-167")
    line = next(x for x in none.stderr.decode().splitlines() if "have no guest cell (" in x)
    assert "no vCPU count gives every device's host node (0,1,2,3) a guest cell" in line


def test_kubelet_settings_come_from_the_kubelet_config(tmp_path):
    """The node's KubeletConfiguration (what `pcitopo doctor --kubelet-dir` reads) decides; the
    assumption line is gone."""
    config = write(tmp_path, "config.yaml", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                   "cpuManagerPolicy: static\ntopologyManagerPolicy: best-effort\nreservedSystemCPUs: 0,112\n")
    root, err = domain("--vmi", vm_with_cores(tmp_path, 16), "--sysfs", B200, "--kubelet-config", config)
    assert "kubelet assumed" not in err and "options none" in err and "65 (9 on node 0, 56 on node 1)" in err
    assert memnodes(root) == ["0", "1"]
    report = write(tmp_path, "doctor.json", {"kubelet": {"policy": "static", "options": {"distribute-cpus-across-numa": "true"},
                                                         "topology_manager_policy": "restricted", "reserved_cpu": "1"}})
    r = run("pcitopo", "domain", "--vmi", vm_with_cores(tmp_path, 16), "--sysfs", B200, "--kubelet-config", report)
    assert r.returncode == 1 and "topologyManagerPolicy restricted" in r.stderr.decode()


def test_without_devices_a_gpu_and_its_pix_nic_are_picked_together_and_said():
    root, err = domain("--vmi", VM_GPU, "--sysfs", B200)
    got = dict(sources(root))
    assert got["ua-gpu-gpu0"] == "0000:1a:00.0" and got["ua-sriov-ib0"] == "0000:1b:00.0"
    assert "picked as `pcitopo pairs` pairs them" in err and "ua-sriov-ib7 0000:c1:00.0" in err


def test_devices_fill_the_requests_in_order_and_nics_pair_with_the_given_gpus():
    root, err = domain("--vmi", VM_GPU, "--sysfs", B200, "--devices", "0000:c0:00.0,0000:bc:00.0")
    got = sources(root)
    assert got[:2] == [("ua-gpu-gpu0", "0000:c0:00.0"), ("ua-gpu-gpu1", "0000:bc:00.0")]
    assert dict(got)["ua-sriov-ib0"] == "0000:c1:00.0"  # gpu0's PIX NIC
    assert "ua-gpu-gpu0" not in err.split("picked as", 1)[1]


def test_sriov_interfaces_take_vfs_of_the_paired_pf():
    vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "s"},
           "spec": {"domain": {"devices": {"gpus": [{"name": "g", "deviceName": "nvidia.com/GH100_H100_SXM5_80GB"}],
                                           "interfaces": [{"name": "default", "masquerade": {}}, {"name": "ib0", "sriov": {}}]}}}}
    r = run("pcitopo", "domain", "--vmi", "-", "--sysfs", SRIOV, stdin=json.dumps(vmi))
    assert r.returncode == 0, r.stderr
    got = dict(sources(etree.fromstring(r.stdout.encode())))
    assert got == {"ua-gpu-g": "0000:18:00.0", "ua-sriov-ib0": "0000:19:00.1"}  # a VF of GPU0's PIX PF 19:00.0


@pytest.mark.parametrize("version,loader", [("v1.6.0", "OVMF_CODE.fd"), ("v1.7.4", "OVMF_CODE.fd"),
                                            ("v1.8.4", "OVMF_CODE.fd"), ("v1.9.0", "OVMF_CODE.secboot.fd"),
                                            ("main", "OVMF_CODE.secboot.fd")])
def test_each_release_writes_its_efi_loader(version, loader):
    root, err = domain("--vmi", VM_GPU, "--sysfs", B200, "--kubevirt", version)
    assert root.findtext("os/loader").endswith("/" + loader)
    assert f"KubeVirt {version} (--kubevirt)" in err


def test_release_versions():
    from pcitopo.kubevirt.releases import ReleaseUnknown

    assert release_of("v1.6.3") is Release.V1_7 and release_of("1.8") is Release.V1_9
    assert release_of("main") is Release.MAIN and release_of("v1.9.0-beta.0.1264+d923fdb815cd20") is Release.MAIN
    # a build suffix (rc, vendor) or a patch nobody read is unknown, not its tag
    for unread in ("v1.9.0-rc.1", "v1.9.0-vendor.3", "v1.5.0", "v1.9.1", "v2.0.0", "v1.10.0-alpha.0"):
        with pytest.raises(ReleaseUnknown):
            release_of(unread)
    with pytest.raises(ConfigError, match="not a KubeVirt release"):
        release_of("latest")


def write(tmp_path: Path, name: str, doc) -> str:
    p = tmp_path / name
    p.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return str(p)


VMI = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "a", "namespace": "ml"}}


@pytest.mark.parametrize("spec,field", [
    ({"domain": {"cpu": {"cores": 2}}}, "spec.domain.devices: missing"),
    ({"domain": {"devices": {"gpus": [{"name": "gpu0"}]}}}, "spec.domain.devices.gpus[0].deviceName: missing"),
    ({"domain": {"devices": {"hostDevices": [{"name": "n"}]}}}, "spec.domain.devices.hostDevices[0].deviceName: missing"),
    ({"domain": {"devices": {}, "cpu": {"numa": {"guestMappingPassthrough": {}}}}}, "spec.domain.cpu.dedicatedCpuPlacement: must be true"),
    ({"domain": {"devices": {}, "cpu": {"dedicatedCpuPlacement": True, "numa": {"guestMappingPassthrough": {}}}}},
     "spec.domain.memory.hugepages: must be requested"),
])
def test_a_manifest_kubevirt_rejects_is_one_line_naming_the_field(tmp_path, spec, field):
    path = write(tmp_path, "vmi.json", {**VMI, "spec": spec})
    for tool, args in (("pcitopo", ["domain", "--vmi", path, "--sysfs", B200]),
                       ("xmlfix", ["--check", "--vmi", path, "--sysfs", B200])):
        r = run(tool, *args)
        lines = r.stderr.decode().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and field in lines[0], r.stderr


@pytest.mark.parametrize("args,said", [
    (["--devices", "0000:ff:00.0"], "0000:ff:00.0 is not a PCI function of the node"),
    (["--devices", "0000:1b:00.0"], "0000:1b:00.0 is a nic, not a gpu"),
    (["--devices", "18:00"], "is not a PCI address"),
    (["--kubevirt", "latest"], "--kubevirt latest: not a KubeVirt release"),
    (["--assume-release", "v1.10.0"], "--assume-release v1.10.0: not a release pcitopo read"),
    (["--cpu-policy", "spread"], "--cpu-policy spread: unknown"),
    (["--topology-policy", "strict"], "--topology-policy strict: unknown"),
    (["--reserved-cpus", "x"], "--reserved-cpus 'x': not a CPU list"),
])
def test_bad_options_are_one_line_naming_them(args, said):
    r = run("pcitopo", "domain", "--vmi", VM_GPU, "--sysfs", B200, *args)
    lines = r.stderr.decode().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and said in lines[0], r.stderr


def test_a_vm_without_template_is_one_line(tmp_path):
    path = write(tmp_path, "vm.yaml",
                 "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: a}\nspec: {runStrategy: Always}\n")
    r = run("pcitopo", "domain", "--vmi", path, "--sysfs", B200)
    assert r.returncode == 2 and "without spec.template" in r.stderr.decode() and len(r.stderr.splitlines()) == 1


def kubevirt_cr(permitted: list[dict], version: str = "v1.8.2") -> dict:
    return {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
            "spec": {"configuration": {"permittedHostDevices": {"pciHostDevices": permitted}, "cpuModel": "Sapphirerapids"}},
            "status": {"observedKubeVirtVersion": version}}


def test_permitted_host_devices_from_the_dump_decide_the_functions(tmp_path):
    ok = write(tmp_path, "ok.json",
               {"kind": "List", "items": [kubevirt_cr([{"pciVendorSelector": "10DE:2901", "resourceName": "nvidia.com/B200"}])]})
    root, err = domain("--vmi", VM_GPU, "--sysfs", B200, "--cluster", ok)
    assert "KubeVirt v1.8.2 (the dump's KubeVirt CR)" in err and root.findtext("os/loader").endswith("/OVMF_CODE.fd")
    assert root.find("cpu").get("mode") == "custom" and root.findtext("cpu/model") == "Sapphirerapids"
    wrong = write(tmp_path, "wrong.json",
                  {"kind": "List", "items": [kubevirt_cr([{"pciVendorSelector": "10DE:2330", "resourceName": "nvidia.com/B200"}])]})
    r = run("pcitopo", "domain", "--vmi", VM_GPU, "--sysfs", B200, "--cluster", wrong)
    assert r.returncode == 2 and "spec.domain.devices.gpus[0]: the node has no free nvidia.com/B200" in r.stderr.decode()


def test_dra_claims_take_the_allocation_of_the_dump(tmp_path):
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "train-pairs-pairs-x7k2", "namespace": "ml",
                          "annotations": {"resource.kubernetes.io/pod-claim-name": "pairs"}},
             "status": {"allocation": {"devices": {"results": [
                 {"request": "gpu0", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-5"}]}}}}
    sl = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
          "spec": {"driver": "gpu.nvidia.com", "pool": {"name": "node-a"}, "devices": [
              {"name": "gpu-5", "attributes": {"resource.kubernetes.io/pciBusID": {"string": "0000:bc:00.0"}}}]}}
    dump = write(tmp_path, "dump.json", {"kind": "List", "items": [claim, sl]})
    root, err = domain("--vmi", str(ROOT / "deploy" / "dra" / "vm-pairs.yaml"), "--sysfs", B300, "--cluster", dump)
    got = dict(sources(root))
    assert got["ua-dra-gpu-gpu0"] == "0000:bc:00.0" and got["ua-dra-hostdevice-nic0"] == "0000:b9:00.0"  # its NIC
    assert "from ResourceClaim train-pairs-pairs-x7k2" in err and "no allocation for request gpu1" in err


INSTANCETYPE = {"apiVersion": "instancetype.kubevirt.io/v1beta1", "kind": "VirtualMachineClusterInstancetype",
                "metadata": {"name": "gn1.8xlarge"},
                "spec": {"cpu": {"guest": 32, "dedicatedCPUPlacement": True, "numa": {"guestMappingPassthrough": {}}},
                         "memory": {"guest": "128Gi", "hugepages": {"pageSize": "1Gi"}},
                         "gpus": [{"name": "gpu1", "deviceName": "nvidia.com/GH100_H100_SXM5_80GB"}]}}
VM_IT = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "it", "namespace": "ml"},
         "spec": {"instancetype": {"name": "gn1.8xlarge"}, "preference": {"name": "cores"},
                  "template": {"spec": {"domain": {"devices": {}}}}}}


def test_instance_types_expand_from_the_dump_or_say_they_are_missing(tmp_path):
    pref = {"apiVersion": "instancetype.kubevirt.io/v1beta1", "kind": "VirtualMachineClusterPreference",
            "metadata": {"name": "cores"}, "spec": {"cpu": {"preferredCPUTopology": "cores"}}}
    vm = write(tmp_path, "vm.json", VM_IT)
    dump = write(tmp_path, "dump.json", {"kind": "List", "items": [INSTANCETYPE, pref]})
    r = run("pcitopo", "domain", "--vmi", vm, "--sysfs", H100, "--cluster", dump)
    # a dump without KubeVirt CR or nodes cannot say the GPU's resource exists: exit 4, said
    assert r.returncode == 4 and "pcitopo domain: unknown: devices: spec.domain.devices.gpus[0]" in r.stderr.decode()
    root = etree.fromstring(r.stdout)
    assert root.find("cpu/topology").get("cores") == "32" and root.findtext("memory") == str(128 * 2**30)
    assert [a for a, _ in sources(root)] == ["ua-gpu-gpu1"] and memnodes(root) == ["0"]
    _, err = domain("--vmi", vm, "--sysfs", H100)
    said = [x for x in err.splitlines() if "instancetype" in x]
    assert len(said) == 1 and "VirtualMachineClusterInstancetype/gn1.8xlarge" in said[0]


def test_xmlfix_explain_on_a_predicted_domain_says_so_first():
    r = run("xmlfix", "--explain", "--vmi", VM_GPU, "--sysfs", B200)
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode().splitlines()
    assert out[0].startswith("domain predicted") and "KubeVirt v1.9.0" in out[0] and out[1].startswith("Verdict:")
    given = run("xmlfix", "--check", "--vmi", VM_GPU, "--sysfs", B200)
    assert given.returncode == 0, given.stderr
    r = run("xmlfix", "--check", "--sysfs", B200, "--devices", "0000:1a:00.0", str(ROOT / "fixtures" / "hgx-b200" / "domain.xml"))
    assert r.returncode == 2 and "--devices is for a predicted domain" in r.stderr.decode()


def test_later_calls_carry_the_hotplug_ports_and_the_release_re_parse():
    """--call N: the hook's input at call N of the boot. v1.9.0 defines three times for a VM with
    one interface (three placeholders first); the second call gets pcitopo's answer as v1.9's
    struct keeps it (placed hostdevs, no controller <model name>); v1.7.4 calls twice."""
    pairs = str(ROOT / "deploy" / "dra" / "vm-pairs.yaml")
    first, err = domain("--vmi", pairs, "--sysfs", B300, "--call", "1")
    assert [i.find("alias").get("name") for i in first.iter("interface")][1:] == [f"placeholder-{i}" for i in range(3)]
    assert "call 1 of 3" in err
    second, _ = domain("--vmi", pairs, "--sysfs", B300, "--call", "2")
    assert all(hd.find("address") is not None for hd in second.iter("hostdev"))
    assert second.find("devices/controller/model") is None and not second.findall(".//target[@chassis]")
    bare, _ = domain("--vmi", pairs, "--sysfs", B300, "--call", "2", "--hook", "none")
    assert not any(c.get("model") == "pcie-expander-bus" for c in bare.iter("controller"))
    r = run("pcitopo", "domain", "--vmi", pairs, "--sysfs", B300, "--kubevirt", "v1.7.4", "--call", "3")
    assert r.returncode == 2 and "calls the hook 2 time(s)" in r.stderr.decode() and len(r.stderr.splitlines()) == 1


@pytest.mark.parametrize("text", ["{bad", "a: [\n", "kind: ConfigMap\napiVersion: v1\n"])
def test_an_unreadable_manifest_is_one_line(tmp_path, text):
    r = run("pcitopo", "domain", "--vmi", write(tmp_path, "m.yaml", text), "--sysfs", B200)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr


def test_a_pf_named_for_an_sriov_interface_gives_its_first_free_vf(tmp_path):
    vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "s"},
           "spec": {"domain": {"devices": {"interfaces": [{"name": "ib0", "sriov": {}}, {"name": "ib1", "sriov": {}}]}}}}
    path = write(tmp_path, "vmi.json", vmi)
    root, err = domain("--vmi", path, "--sysfs", SRIOV, "--devices", "0000:9b:00.0,0000:9b:00.0")
    got = [b for _, b in sources(root)]
    assert len(set(got)) == 2 and all(b.startswith("0000:9b:00.") and not b.endswith(".0") for b in got), got


def test_a_manifest_on_standard_input_is_read_once_by_both_commands():
    """`--vmi -` with no domain: the command reads standard input once and hands the bytes on (a
    second read would find it empty)."""
    text = (ROOT / VM_GPU).read_text()
    r = run("pcitopo", "domain", "--vmi", "-", "--sysfs", B200, stdin=text)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (ROOT / "fixtures" / "hgx-b200" / "examples" / "vm-gpu" / "domain.xml").read_text()
    check = run("xmlfix", "--check", "--vmi", "-", "--sysfs", B200, stdin=text)
    assert check.returncode == 0, check.stderr
    assert check.stderr.splitlines()[-1].startswith("xmlfix: check: ok: ")
