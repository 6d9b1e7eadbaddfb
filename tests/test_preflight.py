"""`pcitopo preflight`: what applying a deploy target does to a cluster's VMs, read from a dump
(fixtures/clusters/, built from KubeVirt v1.9.0's types), and the start model under it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pcitopo.kubevirt.cluster import read_dump
from pcitopo.kubevirt.cluster_verdict import preflight
from pcitopo.kubevirt.starts import Cluster, Start, judge
from pcitopo.kubevirt.targets import target

ROOT = Path(__file__).resolve().parents[1]
DUMPS = ROOT / "fixtures" / "clusters"
BIN = Path(sys.executable).parent
STRANGER = DUMPS / "v1.9.0-stranger.yaml"
FOREIGN = DUMPS / "v1.9.0-foreign-plugin.yaml"
PCITOPO_IMAGE = '[{"image": "registry.example.com/pcitopo:0.1.0"}]'


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "pcitopo"), "preflight", *args], input=stdin, capture_output=True, timeout=120)


def gpu_vmi(labels: dict | None = None, annotations: dict | None = None, devices: dict | None = None) -> dict:
    return {"kind": "VirtualMachineInstance", "metadata": {"name": "v", "namespace": "n", "labels": labels or {},
                                                          "annotations": annotations or {}},
            "spec": {"domain": {"devices": devices if devices is not None else {"gpus": [{"name": "g", "deviceName": "nvidia.com/X"}]}}}}


# -- preflight on the dumps ---------------------------------------------------------------------

def test_the_plugin_target_on_v190_names_the_strangers_vms_and_fails():
    r = run("--target", "kubevirt-main", str(STRANGER))
    out = r.stdout.decode()
    assert r.returncode == 1, out
    harmed = [ln for ln in out.splitlines() if ln.lstrip().startswith("HARMED")]
    assert [ln.split()[1] for ln in harmed] == ["research/train-0", "netops/router-0"]
    assert all("stops starting: does not start" in ln and "kubevirt#18861" in ln for ln in harmed)
    assert "the target does not fit this release" in out and "use kubevirt-v1.9.0" in out
    assert out.splitlines()[-1].startswith("verdict: applying kubevirt-main harms 2 VM(s): research/train-0 (stops starting)")


def test_the_v190_target_harms_no_vm_of_a_cluster_without_plugins():
    r = run("--target", "kubevirt-v1.9.0", str(STRANGER))
    out = r.stdout.decode()
    assert r.returncode == 0, out
    assert "HARMED" not in out and out.splitlines()[-1] == "verdict: ok: applying kubevirt-v1.9.0 harms no VM"
    assert "research/train-0 (VirtualMachineInstance; gpus gpu0, gpus gpu1): pcitopo not attached" in out
    assert "doors on KubeVirt v1.9.0 after the target: the hook sidecar" in out


def test_a_foreign_plugin_is_named_with_the_vms_it_already_stops_and_what_pcitopo_does():
    r = run("--target", "kubevirt-v1.9.0", str(FOREIGN))
    out = r.stdout.decode()
    assert r.returncode == 0, out
    assert "plugins: acme-netplug (not pcitopo)" in out
    assert "down   research/train-0" in out and "already does not start" in out
    note = next(ln for ln in out.splitlines() if ln.startswith("note: Plugin object(s) acme-netplug"))
    assert "research/train-0, netops/router-0" in note and "its hook sidecar writes mode='subsystem'" in note
    # the opted-in VM with both doors starts, but no pcitopo Plugin re-makes the settings on this target
    assert "ml/llm-0 (VirtualMachine; gpus gpu0, SR-IOV interface ib0): starts without maxphysaddr" in out


def test_gpu_nodes_the_daemonset_runs_on_and_misses():
    report = preflight(read_dump([str(STRANGER)]), target("kubevirt-v1.9.0"))
    nodes = {n.name: n.daemonset for n in report.nodes}
    # NFD's default label, the GPU Operator's (vendor only, vm-passthrough), GFD's; the node with
    # GPUs and no label is missed; the CPU node is no GPU node
    assert nodes == {"gpu-nfd-0": True, "gpu-operator-0": True, "gpu-gfd-0": True, "gpu-unlabelled-0": False}
    out = run("--target", "kubevirt-v1.9.0", str(STRANGER)).stdout.decode()
    assert "gpu nodes: 4; the DaemonSet runs on 3, misses 1" in out
    assert "  MISSES  gpu-unlabelled-0 (allocatable nvidia.com/GH100_H100_SXM5_80GB: 8; no GPU label: run Node Feature" in out


def test_a_dump_without_the_kubevirt_cr_is_unknown_not_ok():
    """Without the CR the release, gates and permitted devices are unknown, and unknown is
    not ok (once judged as the target's first release, exit 0)."""
    r = run("--target", "kubevirt-v1.9.0", str(DUMPS / "no-kubevirt.yaml"))
    out = r.stdout.decode()
    assert r.stderr == b"" and "kubevirt: no release: not judged" in out
    assert out.splitlines()[-1].startswith("verdict: unknown: the dump has no KubeVirt CR")
    assert r.returncode == 4


def test_the_json_carries_the_same_facts():
    r = run("--target", "kubevirt-main", "--json", str(STRANGER))
    doc = json.loads(r.stdout)
    assert r.returncode == 1
    assert doc["harmed"] == ["research/train-0", "netops/router-0"] and doc["ok"] is False
    assert doc["kubevirt"] == {"found": True, "release": "v1.9.0", "assumed": None, "gates": ["CPUManager", "HostDevices", "Sidecar"],
                               "target_fits": False, "gates_added": ["Plugins"]}
    assert doc["plugins"] == [] and doc["plugins_after"] == ["pcitopo"]
    llm = next(w for w in doc["workloads"] if w["name"] == "ml/llm-0")
    assert llm["doors"] == {"has": ["hook", "plugin"], "needs": ["hook", "plugin"]} and llm["harm"] is None
    assert [n["name"] for n in doc["gpu_nodes"] if not n["daemonset"]] == ["gpu-unlabelled-0"]


def test_stdin_json_and_multi_document_yaml_read_alike():
    import yaml

    items = yaml.safe_load(STRANGER.read_text())["items"]
    as_json = "\n".join(json.dumps(i) for i in items).encode()
    as_docs = "---\n".join(yaml.safe_dump(i) for i in items).encode()
    for data in (as_json, as_docs):
        r = run("--target", "kubevirt-main", "--json", "-", stdin=data)
        assert r.returncode == 1 and json.loads(r.stdout)["harmed"] == ["research/train-0", "netops/router-0"]


@pytest.mark.parametrize("data,said", [(b"", b"is empty"), (b"items: [\n", b"neither JSON nor YAML"),
                                       (b"- 1\n- 2\n", b"an item has no kind")])
def test_unreadable_input_is_one_line_exit_2(data, said):
    r = run("--target", "kubevirt-v1.9.0", "-", stdin=data)
    assert r.returncode == 2 and r.stdout == b"" and said in r.stderr and r.stderr.count(b"\n") == 1, r.stderr


def test_an_unknown_target_is_one_line_exit_2():
    r = run("--target", "kubevirt-v2", str(STRANGER))
    assert r.returncode == 2 and b"invalid choice" in r.stderr and r.stderr.count(b"\n") == 1


# -- the start model ------------------------------------------------------------------------------

V190 = Cluster("v1.9.0", frozenset({"Sidecar", "Plugins"}), ("acme-netplug",))
HOOK = {"hooks.kubevirt.io/hookSidecars": PCITOPO_IMAGE}
LABEL = {"pcitopo.kubevirt.io/plugin": "true"}


@pytest.mark.parametrize("devices", [{"gpus": [{"name": "g", "deviceName": "nvidia.com/X"}]},
                                     {"hostDevices": [{"name": "h", "deviceName": "example.com/nic"}]},
                                     {"interfaces": [{"name": "s", "sriov": {}}]},
                                     {"gpus": [{"name": "g", "claimName": "c", "requestName": "r"}]}])
def test_every_pci_device_kind_stops_on_v190_with_any_plugin(devices):
    assert judge(gpu_vmi(devices=devices), V190).start is Start.NO_START
    assert judge(gpu_vmi(devices=devices), V190.__class__("v1.9.0", V190.gates, ())).start is Start.DETACHED
    assert judge(gpu_vmi(annotations=HOOK, devices=devices), V190).start is Start.LOST


def test_mediated_devices_and_a_plugin_gate_that_is_off_stop_nothing():
    vgpu = gpu_vmi(devices={"gpus": [{"name": "v", "deviceName": "nvidia.com/A10-4Q"}]})
    assert judge(vgpu, Cluster("v1.9.0", V190.gates, V190.plugins, frozenset({"nvidia.com/A10-4Q"}))).starts
    assert judge(gpu_vmi(), Cluster("v1.9.0", frozenset({"Sidecar"}), ("acme-netplug",))).starts


def test_the_doors_per_release():
    both = gpu_vmi(LABEL, HOOK)
    with_ours = Cluster("v1.9.0", frozenset({"Sidecar", "Plugins"}), ("acme-netplug", "pcitopo"))
    assert judge(both, with_ours).ok and judge(gpu_vmi(annotations=HOOK), with_ours).start is Start.LOST
    fixed = Cluster("main+pr18866", frozenset({"Plugins"}), ("pcitopo",))  # KubeVirt writes mode: the Plugin alone
    assert judge(gpu_vmi(LABEL), fixed).ok
    assert judge(gpu_vmi(annotations=HOOK), Cluster("main+pr18866", frozenset({"Sidecar", "Plugins"}), ("pcitopo",))).start is Start.LOST
    read_main = Cluster("main", frozenset({"Plugins"}), ("pcitopo",))  # main as read (d923fdb8) writes no mode
    assert judge(gpu_vmi(LABEL), read_main).start is Start.NO_START
    v18 = Cluster("v1.8.0", frozenset({"Sidecar", "Plugins"}), ("pcitopo",))  # no Plugin API before v1.9.0
    assert judge(gpu_vmi(annotations=HOOK), v18).ok
    label_only = judge(gpu_vmi(LABEL), v18)
    assert label_only.start is Start.DETACHED and "Plugins came with v1.9.0" in label_only.cause


def test_the_hook_annotation_needs_its_gate_and_valid_json_everywhere():
    no_gate = judge(gpu_vmi(annotations=HOOK), Cluster("v1.8.0"))
    assert no_gate.start is Start.NO_START and "gate Sidecar is off" in no_gate.cause
    bad = {"hooks.kubevirt.io/hookSidecars": '[{"image": "pcitopo"}'}
    for cluster in (Cluster("v1.6.0", frozenset({"Sidecar"})), V190,
                    Cluster("main+pr18866", frozenset({"Sidecar", "Plugins"}), ("pcitopo",))):
        v = judge(gpu_vmi(LABEL, bad), cluster)
        assert v.start is Start.NO_START and "not valid JSON" in v.line, cluster


def test_the_doors_each_opted_in_vm_needs_on_the_release(tmp_path):
    """On v1.9.0 without a Plugin object the hook is the door: a VM with the label alone is told
    to add it; on a release with PR #18866 the Plugin is."""
    text = STRANGER.read_text()
    hook = next(ln for ln in text.splitlines() if "hooks.kubevirt.io/hookSidecars" in ln)
    label_only = tmp_path / "label-only.yaml"
    label_only.write_text(text.replace(hook + "\n", ""))
    out = run("--target", "kubevirt-v1.9.0", str(label_only)).stdout.decode()
    assert "  ml/llm-0: has plugin; add hook" in out
    main = tmp_path / "main.yaml"
    main.write_text(text.replace("observedKubeVirtVersion: v1.9.0", "observedKubeVirtVersion: v1.10.0"))
    r = run("--target", "kubevirt-main", "--assume-release", "main+pr18866", str(main))
    out = r.stdout.decode()
    assert "harmed by the target: 0" in out, out  # KubeVirt writes mode itself: the strangers' VMs keep starting
    assert "doors on KubeVirt main+pr18866 after the target: the pcitopo Plugin" in out and "  ml/llm-0: has hook, plugin" in out
    # but the dump's Sidecar gate is on, and kubevirt-main renders no Sidecar policy
    assert r.returncode == 1 and "SIDECAR OPEN: the KubeVirt gate Sidecar is on and kubevirt-main renders no Sidecar " \
        "policy: any tenant can run any image" in out and "deploy/components/hook-sidecars-policy" in out
    policies = "".join(f"\n---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata: {{name: {n}}}\n"
                       for n in ("pcitopo-hook-sidecars", "pcitopo-hook-sidecars-image"))
    (tmp_path / "policies.yaml").write_text(policies)
    r = run("--target", "kubevirt-main", "--assume-release", "main+pr18866", str(main), str(tmp_path / "policies.yaml"))
    assert r.returncode == 0 and "SIDECAR OPEN" not in r.stdout.decode(), r.stdout.decode()
    # the overlay adds the component: preflight judges its policy as on the hook targets
    r = run("--target", "kubevirt-main", "--assume-release", "main+pr18866", "--component", "hook-sidecars-policy", str(main))
    out = r.stdout.decode()
    assert r.returncode == 0 and "SIDECAR OPEN" not in out and "the target's Sidecar policy refuses at their next start: 0" in out, out


def test_a_development_build_is_main_only_at_the_commit_read():
    """KubeVirt's version of a main build is `git describe`: it names the last tag, not the fixes.
    A build of the commit pcitopo read is main; one of any other commit is unknown, and said to be
    a later main whose Plugin API may have changed (VEP 190 Alpha 2)."""
    from pcitopo.kubevirt.cluster import ClusterDump
    from pcitopo.kubevirt.cluster_verdict import preflight
    from pcitopo.kubevirt.targets import target

    def cr(version):
        return {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
                "spec": {}, "status": {"observedKubeVirtVersion": version}}

    read = preflight(ClusterDump([cr("v1.9.0-beta.0.1264+d923fdb815cd20")]), target("kubevirt-main"))
    assert read.release_fits is True and not read.unknown and read.before.release.endswith("+d923fdb815cd20")
    later = preflight(ClusterDump([cr("v1.9.0-beta.0.1301+0123abcd4567")]), target("kubevirt-main"))
    assert later.unknown and "a build of KubeVirt main other than d923fdb8" in later.unknown
    assert "--assume-release main" in later.unknown
    assert any("domainHooks" in n and "launcherHooks" in n and "#407" in n and "#19160" in n for n in later.notes)


