"""The doctor and the node hook start on kubeadm, RKE2, k3s and OpenShift nodes.

- Every hostPath a target renders (with any of its components) is a folder that exists on every
  Linux node (``/sys``) or one the kubelet creates when it is absent (``DirectoryOrCreate``):
  never a file that must be there (``File``), which keeps the pod in ContainerCreating where a
  distribution keeps it elsewhere (Kubernetes' hostPath types; kubelet ``pkg/volume/hostpath``).
- The kubelet's files come from one component per distribution, at the paths that distribution
  uses (docs/SOURCES.md, "Every distribution"): kubeadm ``/var/lib/kubelet/config.yaml``; OpenShift
  ``/etc/kubernetes/kubelet.conf`` (machine-config-operator's kubelet.service ``--config``); RKE2
  and k3s none (flags and a drop-in folder); the checkpoint ``/var/lib/kubelet/cpu_manager_state``
  on all four (the kubelet's default root directory).
- The doctor, run with the DaemonSet's own arguments on a node-like tree, says in one line which
  kubelet file it could not read and reports its CPU-manager facts as unknown.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pcitopo.kubevirt.targets import TARGETS
from testkit import REPO
from testkit.admission.manifests import DEPLOY, kustomize, overlay, pod_specs

BIN = Path(sys.executable).parent
NODE = REPO / "fixtures" / "hgx-b200"
EVERY_LINUX_NODE = {"/sys"}  # folders the kernel gives every Linux node
STATE = "/var/lib/kubelet/cpu_manager_state"
DISTRIBUTIONS = {  # component -> the host files it mounts (each as a read-only file)
    "doctor-kubelet-kubeadm": {STATE, "/var/lib/kubelet/config.yaml"},
    "doctor-kubelet-openshift": {STATE, "/etc/kubernetes/kubelet.conf"},
    "doctor-kubelet-rke2-k3s": {STATE},
}
TARGET_COMPONENTS = {"kubevirt-v1.6-v1.8": ("attach-hook",), "kubevirt-v1.9.0": ("attach-hook",),
                     "kubevirt-main": ("attach-plugin", "hook-sidecars-policy")}
needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (kustomize v5)")


def host_paths(docs: list[dict]) -> list[tuple[str, str, str]]:
    """(DaemonSet, host path, hostPath type) of every hostPath volume a container mounts."""
    out = []
    for name, spec in pod_specs(docs):
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            for m in c.get("volumeMounts") or []:
                hp = volumes[m["name"]].get("hostPath")
                if hp:
                    out.append((name, hp["path"], hp.get("type", "")))
    return out


def startable_everywhere(path: str, kind: str) -> bool:
    return kind == "DirectoryOrCreate" or (kind == "Directory" and path in EVERY_LINUX_NODE)


@needs_kubectl
@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_every_hostpath_of_a_target_exists_on_any_linux_node_or_is_created(tmp_path, target):
    site = overlay(tmp_path / "site", target.name, new_name="r.example/p", digest="sha256:" + "ab" * 32,
                   components=TARGET_COMPONENTS[target.name])
    paths = host_paths(kustomize(site))
    assert {name for name, _, _ in paths} >= {"pcitopo-doctor"}
    assert [p for p in paths if not startable_everywhere(p[1], p[2])] == []


def test_the_rule_refuses_a_file_a_node_may_lack():
    assert not startable_everywhere("/var/lib/kubelet/config.yaml", "File")
    assert not startable_everywhere("/var/lib/kubelet/config.yaml", "")
    assert not startable_everywhere("/dev/vfio", "Directory")
    assert startable_everywhere("/var/run/pcitopo", "DirectoryOrCreate") and startable_everywhere("/sys", "Directory")


@needs_kubectl
@pytest.mark.parametrize("component", sorted(DISTRIBUTIONS))
def test_each_distribution_component_mounts_its_kubelet_files_read_only_where_the_doctor_reads_them(tmp_path, component):
    site = overlay(tmp_path / "site", "kubevirt-v1.9.0", new_name="r.example/p", digest="sha256:" + "ab" * 32,
                   components=(component,))
    docs = kustomize(site)
    (spec,) = [s for n, s in pod_specs(docs) if n == "pcitopo-doctor"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    (c,) = spec["containers"]
    files = {volumes[m["name"]]["hostPath"]["path"]: m for m in c["volumeMounts"]
             if volumes[m["name"]].get("hostPath", {}).get("type") == "File"}
    assert set(files) == DISTRIBUTIONS[component]
    kubelet_dir = c["args"][c["args"].index("--kubelet-dir") + 1]
    for path, mount in files.items():
        assert mount["readOnly"] is True
        want = "cpu_manager_state" if path == STATE else "config.yaml"
        assert mount["mountPath"] == f"{kubelet_dir}/{want}", path
    everything_else = [p for p in host_paths(docs) if p[1] not in files]
    assert [p for p in everything_else if not startable_everywhere(p[1], p[2])] == []


def doctor_args() -> list[str]:
    """The doctor DaemonSet's own arguments, as deploy/base renders them."""
    import yaml

    docs = [d for d in yaml.safe_load_all((DEPLOY / "base" / "doctor.yaml").read_text()) if d]
    (c,) = docs[0]["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["pcitopo"], "the doctor is the container's one process, no shell"
    return c["args"]


def on_node(args: list[str], node: Path) -> list[str]:
    """The same arguments on a node-like tree: /host/... under ``node``, one pass (no --every)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--every":
            skip = True
        else:
            out.append(str(node) + a if a.startswith("/") else a)
    return out


@pytest.mark.parametrize("files,line", [
    ((), "kubelet: cannot read the CPU manager's settings: {k}/cpu_manager_state (absent); {k}/config.yaml (absent); "
         "policy and options unknown"),
    (("cpu_manager_state",), "kubelet: CPU manager policy static (cpu_manager_state), options unknown (config file not "
                             "read), topology manager policy unknown (not read: {k}/config.yaml (absent))"),
    (("cpu_manager_state", "config.yaml"), "kubelet: CPU manager policy static (cpu_manager_state), options none"),
], ids=["base, any distribution", "rke2-k3s component", "kubeadm or openshift component"])
def test_the_doctor_with_its_daemonset_arguments_on_a_node_without_kubeadms_file(tmp_path, files, line):
    node = tmp_path / "node"
    for folder in ("textfile", "features.d", "var/run/pcitopo", "host"):
        (node / folder).mkdir(parents=True)
    os.symlink(NODE, node / "host" / "sys")
    kdir = node / "host" / "var" / "lib" / "kubelet"
    if files:
        kdir.mkdir(parents=True)
    if "cpu_manager_state" in files:
        (kdir / "cpu_manager_state").write_text('{"policyName":"static","defaultCpuSet":"0,112","entries":{},"checksum":1}')
    if "config.yaml" in files:
        (kdir / "config.yaml").write_text("kind: KubeletConfiguration\ncpuManagerPolicy: static\n")
    r = subprocess.run([str(BIN / "pcitopo"), *on_node(doctor_args(), node)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (got,) = [x for x in r.stdout.splitlines() if x.startswith("kubelet:")]
    assert got.startswith(line.format(k=kdir)), got
    if not files:  # the docs quote what a node without any component prints
        docs = "\n".join(p.read_text() for p in sorted((REPO / "docs").glob("*.md")))
        assert line.format(k="/host/var/lib/kubelet") in docs
    assert (node / "var/run/pcitopo/doctor.json").exists() and (node / "textfile/pcitopo.prom").exists()


def test_every_runs_passes_until_sigterm_and_logs_each(tmp_path):
    p = subprocess.Popen([str(BIN / "pcitopo"), "doctor", "--every", "10", "--sysfs", str(NODE), "--json-out",
                          str(tmp_path / "doctor.json")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "doctor.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert [x for x in out.splitlines() if x.startswith("pcitopo doctor exit 0 at ")], out[-500:]


@pytest.mark.parametrize("value", ["0", "9", "86401", "ten", "-5", ""])
def test_every_takes_seconds_from_10_to_a_day_or_refuses_in_one_line(value):
    r = subprocess.run([str(BIN / "pcitopo"), "doctor", "--every", value, "--sysfs", str(NODE)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--every" in r.stderr, r.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare (a bind mount)")
def test_every_ends_when_a_mounted_kubelet_file_is_replaced_on_the_host(tmp_path):
    """A file bind mount keeps its inode; the kubelet's rename over it on the host leaves the
    mount at link count 0 with the old content. The loop then ends (exit 0) so the kubelet starts
    the container again with the current file: measured in a private mount namespace."""
    host, ctr = tmp_path / "host", tmp_path / "ctr" / "kubelet"
    host.mkdir()
    ctr.mkdir(parents=True)
    (host / "cpu_manager_state").write_text('{"policyName":"none"}')
    (ctr / "cpu_manager_state").touch()
    script = (f"mount --bind {host}/cpu_manager_state {ctr}/cpu_manager_state && "
              f"echo '{{\"policyName\":\"static\"}}' > {host}/new && mv {host}/new {host}/cpu_manager_state && "
              f"exec {BIN}/pcitopo doctor --every 600 --sysfs {NODE} --kubelet-dir {ctr}")
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    if "mount" in r.stderr and r.returncode != 0 and "pcitopo" not in r.stdout:
        pytest.skip(f"no bind mount here: {r.stderr.strip()[:200]}")
    assert r.returncode == 0, r.stderr
    assert "kubelet: CPU manager policy none (cpu_manager_state)" in r.stdout  # the mounted, old content
    assert f"{ctr}/cpu_manager_state replaced on the host since it was mounted; ending" in r.stdout
