"""Least privilege on the node: every container that any deploy target renders (with every
component it can take) runs without privilege, under seccomp RuntimeDefault, with a read-only
root and no privilege escalation, drops every capability, never mounts the kubelet's directory
(which holds every pod's secrets on the node), and adds CAP_SYS_ADMIN only in the doctor, whose
manifest says why on the line above. The node hook adds nothing and has a PriorityClass and a
memory limit."""

from __future__ import annotations

import copy
import posixpath

import pytest

from pcitopo.kubevirt.targets import TARGETS
from testkit.admission.manifests import DEPLOY, kustomize, overlay, pod_specs

KUBELET_DIR = "/var/lib/kubelet"
# The doctor's reason, as the line above its `add` says it (deploy/base/doctor.yaml).
SYS_ADMIN_REASON = "# reason: config space past 64 bytes (ACS, ATS)"
COMPONENTS = {"kubevirt-v1.6-v1.8": ("attach-hook",), "kubevirt-v1.9.0": ("attach-hook",), "kubevirt-main": ("attach-plugin",)}


# The node hook's init container gives its socket folder to uid 107 (deploy/targets/kubevirt-main/node-hook.yaml).
CHOWN_REASON = "# reason: give the socket folder to the node hook's uid"
ALLOWED_ADDS = {("doctor", "SYS_ADMIN"): SYS_ADMIN_REASON, ("socket-folder", "CHOWN"): CHOWN_REASON}


def reason_for_sys_admin(daemonset: str, container: str, cap: str = "SYS_ADMIN") -> bool:
    """Whether the manifest that defines this DaemonSet says, on the line above the container's
    `add: ["CAP"]`, why (the reason ALLOWED_ADDS names for that container and capability)."""
    reason = ALLOWED_ADDS.get((container, cap))
    for path in DEPLOY.rglob("*.yaml"):
        text = path.read_text()
        if reason is None or f"kind: DaemonSet\nmetadata:\n  name: {daemonset}\n" not in text:
            continue
        part = text[text.index(f"- name: {container}\n"):]
        above = part[:part.index(f'add: ["{cap}"]')].splitlines()[:-1]  # the lines before the add line
        return bool(above) and above[-1].strip().startswith(reason)
    return False


def _mount_breaches(spec: dict, c: dict) -> list[str]:
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    out = []
    for m in c.get("volumeMounts") or []:
        host = (volumes[m["name"]].get("hostPath") or {})
        path = posixpath.normpath(host.get("path", "")) if host else None
        if path is None:
            continue
        if KUBELET_DIR == path or KUBELET_DIR.startswith(path.rstrip("/") + "/") or path == "/":
            out.append(f"mounts {path} (the kubelet's directory whole)")
        elif path.startswith(KUBELET_DIR + "/") and not (host.get("type") == "File" and m.get("readOnly")):
            out.append(f"mounts {path} from the kubelet's directory other than as a read-only file")
    return out


def breaches(daemonset: str, spec: dict) -> list[str]:
    """Every rule a DaemonSet's pod spec breaks, one line each."""
    out = []
    if spec.get("hostPID") or spec.get("hostIPC") or spec.get("hostNetwork"):
        out.append("shares a host namespace")
    pod_seccomp = ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        sc = c.get("securityContext") or {}
        where = f"{daemonset}/{c['name']}: "
        caps = sc.get("capabilities") or {}
        if sc.get("privileged"):
            out.append(where + "privileged")
        if ((sc.get("seccompProfile") or {}).get("type") or pod_seccomp) != "RuntimeDefault":
            out.append(where + "no seccompProfile RuntimeDefault")
        if sc.get("readOnlyRootFilesystem") is not True:
            out.append(where + "root filesystem writable")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(where + "privilege escalation allowed")
        if caps.get("drop") != ["ALL"]:
            out.append(where + "does not drop ALL capabilities")
        for cap in caps.get("add") or []:
            if not reason_for_sys_admin(daemonset, c["name"], cap):
                out.append(where + f"adds {cap}")
        if "memory" not in ((c.get("resources") or {}).get("limits") or {}):
            out.append(where + "no memory limit")
        out += [where + b for b in _mount_breaches(spec, c)]
    return out


def rendered(tmp_path, target) -> list[dict]:
    site = overlay(tmp_path / "site", target.name, new_name="r.example/pcitopo", digest="sha256:" + "ab" * 32,
                   components=COMPONENTS[target.name])
    return kustomize(site)


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_no_rendered_container_has_more_than_it_needs(tmp_path, target):
    docs = rendered(tmp_path, target)
    specs = pod_specs(docs)
    assert specs and [d for d in docs if d["kind"] in ("Pod", "Deployment", "StatefulSet", "Job")] == []
    assert [b for name, spec in specs for b in breaches(name, spec)] == []
    added = {(name, c["name"]) for name, spec in specs for c in spec["containers"]
             if (c["securityContext"]["capabilities"].get("add"))}
    assert added == {("pcitopo-doctor", "doctor")}


@pytest.mark.parametrize("target", [t for t in TARGETS if t.node_hook], ids=lambda t: t.name)
def test_the_node_hook_adds_no_capability_and_outranks_the_vms(tmp_path, target):
    docs = rendered(tmp_path, target)
    (spec,) = [spec for name, spec in pod_specs(docs) if name == "pcitopo-node-hook"]
    (c,) = spec["containers"]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    classes = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PriorityClass"}
    assert classes[spec["priorityClassName"]]["value"] > 0 and not classes[spec["priorityClassName"]].get("globalDefault")
    # it reads the doctor's report (ACS, ATS) from the folder the doctor writes, read-only
    (doctor,) = [s for name, s in pod_specs(docs) if name == "pcitopo-doctor"]
    script = " ".join(doctor["containers"][0]["args"])
    report = script[script.index("--json-out") + len("--json-out"):].split()[0]
    assert f"--doctor-report {report}" in " ".join(c["args"])
    hook_mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    folder = posixpath.dirname(report)
    assert hook_mounts[folder]["readOnly"] is True
    host = {v["name"]: v.get("hostPath", {}).get("path") for v in spec["volumes"]}
    doctor_host = {v["name"]: v.get("hostPath", {}).get("path") for v in doctor["volumes"]}
    (doctor_mount,) = [m for m in doctor["containers"][0]["volumeMounts"] if m["mountPath"] == folder]
    assert host[hook_mounts[folder]["name"]] == doctor_host[doctor_mount["name"]] == folder


@pytest.mark.parametrize("component,files", [
    ((), []), (("doctor-kubelet-rke2-k3s",), ["cpu_manager_state"]),
    (("doctor-kubelet-kubeadm",), ["config.yaml", "cpu_manager_state"]),
    (("doctor-kubelet-openshift",), ["cpu_manager_state"]),  # its config file is /etc/kubernetes/kubelet.conf
])
def test_the_doctor_mounts_kubelet_files_only_one_by_one_and_says_why_it_keeps_sys_admin(tmp_path, component, files):
    """The base mounts no kubelet file (it starts on every distribution); each distribution's
    component mounts single files, read-only, never the folder (tests/test_every_distribution.py)."""
    site = overlay(tmp_path / "site", TARGETS[0].name, new_name="r.example/pcitopo", digest="sha256:" + "ab" * 32,
                   components=component)
    (spec,) = [spec for name, spec in pod_specs(kustomize(site)) if name == "pcitopo-doctor"]
    assert breaches("pcitopo-doctor", spec) == []
    volumes = {v["name"]: v for v in spec["volumes"]}
    kubelet = sorted(volumes[m["name"]]["hostPath"]["path"] for m in spec["containers"][0]["volumeMounts"]
                     if volumes[m["name"]].get("hostPath", {}).get("path", "").startswith(KUBELET_DIR))
    assert kubelet == [f"{KUBELET_DIR}/{f}" for f in files]
    assert reason_for_sys_admin("pcitopo-doctor", "doctor")
    text = (DEPLOY / "base" / "doctor.yaml").read_text()
    assert 'unknown (needs root)' in text and "delete the `add` line" in text


SPEC = {"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "node-hook", "securityContext": {
            "privileged": False, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]}}, "resources": {"limits": {"memory": "1Gi"}},
            "volumeMounts": [{"name": "cfg", "mountPath": "/k/config.yaml", "readOnly": True}]}],
        "volumes": [{"name": "cfg", "hostPath": {"path": "/var/lib/kubelet/config.yaml", "type": "File"}}]}


@pytest.mark.parametrize("change,breach", [
    (lambda c, s: c["securityContext"].update(privileged=True), "privileged"),
    (lambda c, s: s.pop("securityContext"), "no seccompProfile RuntimeDefault"),
    (lambda c, s: c["securityContext"].update(readOnlyRootFilesystem=False), "root filesystem writable"),
    (lambda c, s: c["securityContext"].pop("allowPrivilegeEscalation"), "privilege escalation allowed"),
    (lambda c, s: c["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]), "adds SYS_ADMIN"),
    (lambda c, s: c["securityContext"]["capabilities"].update(add=["NET_RAW"]), "adds NET_RAW"),
    (lambda c, s: c["resources"].pop("limits"), "no memory limit"),
    (lambda c, s: s["volumes"][0]["hostPath"].update(path="/var/lib/kubelet/"), "the kubelet's directory whole"),
    (lambda c, s: s["volumes"][0]["hostPath"].update(path="/var/lib"), "the kubelet's directory whole"),
    (lambda c, s: s["volumes"][0]["hostPath"].update(type="Directory"), "other than as a read-only file"),
    (lambda c, s: c["volumeMounts"][0].pop("readOnly"), "other than as a read-only file"),
])
def test_the_rules_catch_each_breach(change, breach):
    assert breaches("pcitopo-node-hook", SPEC) == []
    spec = copy.deepcopy(SPEC)
    change(spec["containers"][0], spec)
    found = breaches("pcitopo-node-hook", spec)
    assert len(found) == 1 and breach in found[0], found


def test_sys_admin_in_the_doctor_without_its_reason_is_a_breach(tmp_path, monkeypatch):
    docs = rendered(tmp_path, TARGETS[0])
    (spec,) = [spec for name, spec in pod_specs(docs) if name == "pcitopo-doctor"]
    assert breaches("pcitopo-doctor", spec) == []
    tree = tmp_path / "deploy"
    (tree / "base").mkdir(parents=True)
    text = (DEPLOY / "base" / "doctor.yaml").read_text().replace(SYS_ADMIN_REASON, "# needed")
    (tree / "base" / "doctor.yaml").write_text(text)
    monkeypatch.setattr(f"{__name__}.DEPLOY", tree)
    assert breaches("pcitopo-doctor", spec) == ["pcitopo-doctor/doctor: adds SYS_ADMIN"]


def test_the_doctor_takes_its_files_off_the_host_when_its_pod_goes(tmp_path):
    """A rollback returns the node to what it was: the doctor's preStop removes exactly the files
    its command writes on the host (each in a hostPath folder), and nothing else."""
    docs = rendered(tmp_path, TARGETS[0])
    (spec,) = [spec for name, spec in pod_specs(docs) if name == "pcitopo-doctor"]
    (c,) = spec["containers"]
    words = " ".join(c["args"]).replace("\\", " ").split()
    written = {words[i + 1] for i, w in enumerate(words) if w in ("--prometheus-out", "--nfd-out", "--json-out")}
    assert len(written) == 3
    rm = c["lifecycle"]["preStop"]["exec"]["command"]
    assert rm[:2] == ["rm", "-f"] and set(rm[2:]) == written
    hostpath = {v["name"] for v in spec["volumes"] if "hostPath" in v}
    folders = {m["mountPath"] for m in c["volumeMounts"] if m["name"] in hostpath}
    assert all(posixpath.dirname(f) in folders for f in written)
