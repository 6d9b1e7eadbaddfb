"""The node hook's device rule, in process (no gRPC): which of the node's devices a VMI's
requests can be, and when a failing check is surely the VM's (src/pcitopo/serve/plugin/devices.py,
nodehook.py; docs/SOURCES.md, "The node hook's devices")."""

from __future__ import annotations

import json
import os
import re

import pytest

from pcitopo.kubevirt.hostdevices import PermittedHostDevices, PermittedPCI
from pcitopo.serve.hooks import HostCache
from pcitopo.serve.plugin.devices import MAX_REQUESTS
from pcitopo.serve.plugin.doctorfile import DoctorFile
from pcitopo.serve.plugin.nodehook import NodeSettings, check_node
from testkit.hookkit import fixture_sysfs

REQUIRE = {"pcitopo.kubevirt.io/doctor": "require"}
BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
H100 = PermittedHostDevices((PermittedPCI("nvidia.com/GH100", "10de:2330"), PermittedPCI("nvidia.com/CX7", "15b3:1021")), listed=True)


@pytest.fixture(scope="module")
def faults() -> HostCache:
    """hgx-h100-faults: seven vfio-pci H100s, five of them (or the bridges above) failing."""
    return HostCache(fixture_sysfs("hgx-h100-faults"))


def vmi(gpus: list[dict], annotations: dict[str, str] | None = REQUIRE, **devices) -> bytes:
    return json.dumps({"metadata": {"name": "vm", "namespace": "ns", "annotations": annotations or {}},
                       "spec": {"domain": {"devices": {"gpus": gpus, **devices}}}}).encode()


def plugin_gpus(n: int, resource: str = "nvidia.com/GH100") -> list[dict]:
    return [{"name": f"gpu{i}", "deviceName": resource} for i in range(n)]


def test_a_resource_whose_failing_devices_the_vm_can_avoid_is_not_refused(faults):
    """Two of seven GH100s, five failing: the pod may have the two good ones."""
    v = check_node(vmi(plugin_gpus(2)), "n", faults, NodeSettings(H100))
    assert v.refusal is None and v.outcome == "not-ready"
    assert v.fields["device_source"] == "device-plugin" and v.fields["sure_failures"] == 0


def test_a_resource_whose_failing_devices_the_vm_cannot_avoid_is_refused_by_its_name(faults):
    """Three of seven, five failing: at least one of the VM's fails. The refusal names the
    resource and counts, never one of the node's devices (it may be another VM's)."""
    v = check_node(vmi(plugin_gpus(3)), "n", faults, NodeSettings(H100))
    msg = v.refusal.reason
    assert "resource nvidia.com/GH100: 5 of the 7 devices it can be given on this node fail" in msg
    assert "at least one of this VM's 3 does" in msg and not BDF.search(msg) and "\n" not in msg


def test_a_resource_the_kubevirt_cr_does_not_map_is_listed_as_unknown(faults):
    v = check_node(vmi(plugin_gpus(2, "example.com/other")), "n", faults, NodeSettings(H100))
    assert v.refusal is None and v.fields["device_source"] == "any-vfio-of-kind"
    assert v.fields["could_not_know"] == ["resource example.com/other (no permittedHostDevices entry)"]


def test_dra_requests_are_listed_as_unknown_with_their_claims(faults):
    dra = [{"name": "a", "claimName": "gpus", "requestName": "r0"}, {"name": "b", "claimName": "gpus", "requestName": "r1"}]
    v = check_node(vmi(dra), "n", faults, NodeSettings(H100))
    assert v.refusal is None and v.fields["vm_devices"] == {"DRA gpus": 2}
    assert v.fields["could_not_know"] == ["gpus/a (DRA claim gpus/r0)", "gpus/b (DRA claim gpus/r1)"]


def test_names_from_the_vmi_reach_the_log_as_kubernetes_names_only(faults):
    dra = [{"name": "x\ny", "claimName": "c\u2028" + "d" * 500, "requestName": 7}]
    v = check_node(vmi(dra), "n", faults, NodeSettings(H100))
    [shown] = v.fields["could_not_know"]
    assert shown.startswith("gpus/x?y (DRA claim c?ddd") and "..." in shown and len(shown) < 200


def test_device_requests_past_the_cap_are_counted_not_looked_at(faults):
    many = [{"name": f"g{i}", "claimName": f"c{i}", "requestName": "r"} for i in range(MAX_REQUESTS + 1000)]
    v = check_node(vmi(many), "n", faults, NodeSettings(H100))
    assert v.fields["could_not_know"][0] == f"1000 more device requests (past the first {MAX_REQUESTS})"
    assert v.fields["vm_devices"] == {"DRA gpus": MAX_REQUESTS}


def test_sriov_interfaces_are_listed_as_unknown(faults):
    v = check_node(vmi(plugin_gpus(2), interfaces=[{"name": "rdma0", "sriov": {}}, {"name": "pod", "masquerade": {}}]),
                   "n", faults, NodeSettings(H100))
    assert v.fields["could_not_know"] == ["interfaces/rdma0 (SR-IOV)"]


def test_a_vmi_asking_for_no_host_device_is_skipped(faults):
    v = check_node(vmi([]), "n", faults, NodeSettings(H100))
    assert v.outcome == "skipped" and v.fields["device_source"] == "none"


def test_a_doctor_report_that_is_not_the_doctors_json_is_not_used(tmp_path):
    bad = tmp_path / "doctor.json"
    bad.write_text('{"checks": [{"check": "acs", "status": "maybe", "bdf": "0000:17:01.0", "message": "", "fix": null}]}')
    found, why = DoctorFile(str(bad)).findings()
    assert found == {} and why == f"the doctor's report {bad} is not `pcitopo doctor --json` output"
    old = os.stat(bad).st_mtime - 3600
    os.utime(bad, (old, old))
    assert "is stale" in DoctorFile(str(bad)).findings()[1]


def test_a_refusal_for_the_vms_own_device_names_no_other_device(faults):
    """All seven GH100s are the VM's (it asks for eight): the refusal names them, and shows the
    NIC sharing GPU3's IOMMU group, which may be another VM's, only as "another device"."""
    v = check_node(vmi(plugin_gpus(8)), "n", faults, NodeSettings(H100))
    msg = v.refusal.reason
    assert msg.startswith("n cannot give this VM GPUDirect RDMA (annotation pcitopo.kubevirt.io/doctor is require): "
                          "iommu-group GPU3 0000:5d:00.0: IOMMU group 900 also holds another device: "), msg
    gpus = {str(b) for b in faults().bdfs() if faults().function(b).ids == "10de:2330"}
    bridges = {str(a.bdf) for b in gpus for a in faults().ancestry(faults().function(b))}
    assert set(BDF.findall(msg)) <= gpus | bridges


def test_permitted_host_devices_option_is_for_the_node_hook_only(tmp_path):
    import subprocess

    from testkit.server_proc import serve_argv

    r = subprocess.run([*serve_argv(tmp_path / "s.sock", fixture_sysfs("hgx-b200")), "--permitted-host-devices", str(tmp_path / "k.yaml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--permitted-host-devices is for --node-hook" in r.stderr


def test_logged_and_refused_names_are_bounded(faults):
    """virt-handler sends the node's name, the hook point and the VMI's names; a local client can
    send any length. The log line and the refusal carry at most 80 characters of each (a
    Kubernetes name's characters), and the VMI's namespace/name at most 253 each."""
    import io
    import threading

    from pcitopo.serve.hooks import CallFailed, Hooks, JsonLog

    stream = io.StringIO()
    hooks = Hooks(faults, JsonLog(stream), threading.Event(), permitted=NodeSettings(H100))
    long = "n" * 100_000
    doc = json.loads(vmi(plugin_gpus(8)))
    doc["metadata"]["name"] = "v" * 100_000
    with pytest.raises(CallFailed) as e:
        hooks.execute_node_hook("PreVMStart", json.dumps(doc).encode(), long)
    hooks.execute_node_hook("x\n" * 50_000, b"{}", long)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["outcome"] == "refused" and first["node"] == "n" * 80 + "..." and len(first["vmi"]) == len("ns/") + 256
    assert len(e.value.details) < 2000 and ("n" * 80 + "... cannot give this VM") in e.value.details
    assert second["outcome"] == "ignored" and len(second["hook_point"]) == 83 and "\n" not in second["hook_point"]
