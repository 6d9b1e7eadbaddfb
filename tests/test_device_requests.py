"""One reading of a device request and of a node (src/pcitopo/kubevirt/hostdevices.py; docs/SOURCES.md,
"Device requests and permittedHostDevices").

- A resource name the dump's KubeVirt CR does not permit fails ``xmlfix --check --cluster`` and
  ``pcitopo domain --cluster`` in one line naming the request and the cluster's names, as
  virt-controller refuses to render its pod (``validatePermittedHostDevices``,
  ``pkg/virt-controller/services/renderresources.go``, v1.9.0 and main); without
  ``permittedHostDevices`` it is unknown (exit 4) unless a node advertises it; preflight gives the
  same cause for the same VM.
- The node hook and the prediction take a request's functions from the same rule.
- A sysfs copy without driver or iommu_group links is unknown in every command, in ``pcitopo
  capture``'s words; only a live sysfs (or a capture of one) makes a missing link a failure.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from pcitopo.checks.doctor import run_checks
from pcitopo.cli.main import pcitopo_main, xmlfix_main
from pcitopo.host.capture import MISSING_COSTS, capture_tree
from pcitopo.host.sysfs import open_host
from pcitopo.kubevirt.cluster import read_dump
from pcitopo.kubevirt.cluster_verdict import preflight
from pcitopo.kubevirt.hostdevices import PermittedHostDevices, PermittedPCI, judge_names, reach
from pcitopo.kubevirt.manifest import as_vmi
from pcitopo.kubevirt.targets import target
from pcitopo.program import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_OK, EXIT_UNKNOWN
from testkit import REPO

CLUSTERS = REPO / "fixtures" / "clusters"
STRANGER = CLUSTERS / "v1.9.0-stranger.yaml"
H100, H200 = REPO / "fixtures" / "hgx-h100", REPO / "fixtures" / "hgx-h200-snc2"
EXAMPLE = REPO / "deploy" / "vmi-gpu.yaml"  # 8 GPUs and 8 SR-IOV NICs, deviceName nvidia.com/B200


def example_asking(tmp_path: Path, resource: str) -> Path:
    out = tmp_path / f"vmi-{resource.replace('/', '_')}.yaml"
    out.write_text(EXAMPLE.read_text().replace("nvidia.com/B200", resource))
    return out


def dump_without(tmp_path: Path, drop: str) -> Path:
    """The stranger dump without the KubeVirt CR's ``permittedHostDevices`` (``key``) or the CR."""
    doc = yaml.safe_load(STRANGER.read_text())
    if drop == "cr":
        doc["items"] = [o for o in doc["items"] if o["kind"] != "KubeVirt"]
    else:
        del next(o for o in doc["items"] if o["kind"] == "KubeVirt")["spec"]["configuration"]["permittedHostDevices"]
    out = tmp_path / f"without-{drop}.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


def check(capsys, vmi: Path, sysfs: Path, dump: Path, *extra: str) -> tuple[int, list[str]]:
    rc = xmlfix_main(["--check", "--vmi", str(vmi), "--sysfs", str(sysfs), "--cluster", str(dump), "--cpu-policy", "devices", *extra])
    return rc, capsys.readouterr().err.splitlines()


def domain(capsys, vmi: Path, sysfs: Path, dump: Path, *extra: str) -> tuple[int, str, list[str]]:
    rc = pcitopo_main(["domain", "--vmi", str(vmi), "--sysfs", str(sysfs), "--cluster", str(dump), "--cpu-policy", "devices", *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err.splitlines()


# -- names the cluster does not have ----------------------------------------------------------------

# nvidia.com/GB100_B200 is a name the prediction would otherwise guess (10de:2901) and then blame on
# driver binding on this H200 node; the dump permits nvidia.com/GH100_H100_SXM5_80GB and nvidia.com/B200
@pytest.mark.parametrize("resource", ["nvidia.com/GH100_H200_SXM5_141GB", "nvidia.com/gpu", "nvidia.com/GB100_B200"])
def test_a_name_the_cluster_does_not_permit_fails_in_one_line_naming_its_names(tmp_path, capsys, resource):
    vmi = example_asking(tmp_path, resource)
    rc, err = check(capsys, vmi, H200, STRANGER)
    said = [line for line in err if line.startswith("xmlfix: check: devices: ")]
    assert rc == EXIT_CHECK_FAILED and len(said) == 1, err
    assert f"spec.domain.devices.gpus[0] and 7 more ask for {resource}, which the KubeVirt CR's permittedHostDevices does " \
           "not list" in said[0]
    assert "the cluster has nvidia.com/GH100_H100_SXM5_80GB, nvidia.com/B200, nvidia.com/NVIDIA_A10-4Q (permittedHostDevices), " \
           "nvidia.com/GH100_H100_SXM5_80GB (nodes' allocatable)" in said[0]
    assert err[-1] == "xmlfix: check: failed: devices (above)"
    assert not any("bound to vfio-pci" in line for line in err)  # not blamed on driver binding
    rc, out, err = domain(capsys, vmi, H200, STRANGER)
    assert rc == EXIT_CHECK_FAILED and out == "" and [line[len("pcitopo domain: "):] for line in err] == [said[0][len("xmlfix: check: "):]]


def test_a_permitted_name_the_node_lacks_is_still_the_driver_binding_message(tmp_path, capsys):
    """nvidia.com/GH100_H100_SXM5_80GB exists (permitted, advertised) but stands for 10de:2330,
    and the H200 node has 10de:2335 GPUs only."""
    rc, err = check(capsys, example_asking(tmp_path, "nvidia.com/GH100_H100_SXM5_80GB"), H200, STRANGER)
    assert rc == EXIT_BAD_INPUT and "no free nvidia.com/GH100_H100_SXM5_80GB gpu bound to vfio-pci" in err[-1]
    rc, err = check(capsys, example_asking(tmp_path, "nvidia.com/GH100_H100_SXM5_80GB"), H100, STRANGER)
    assert rc == EXIT_OK and not any(": devices: " in line for line in err), err


@pytest.mark.parametrize("drop, why", [("key", "the dump's KubeVirt CR has no permittedHostDevices"),
                                       ("cr", "the dump has no KubeVirt CR")])
def test_without_permitted_host_devices_a_name_no_node_advertises_is_unknown(tmp_path, capsys, drop, why):
    dump = dump_without(tmp_path, drop)
    release = ("--kubevirt", "v1.9.0")  # a dump without the CR does not say it
    rc, err = check(capsys, EXAMPLE, H100, dump, *release)
    # without a CR no gate is on either, so the check fails on gate Sidecar and still says the unknown
    assert rc == (EXIT_UNKNOWN if drop == "key" else EXIT_CHECK_FAILED), err
    assert any(line.startswith(f"xmlfix: check: unknown: devices: spec.domain.devices.gpus[0] and 7 more ask for "
                               f"nvidia.com/B200: {why}, and no node in the dump advertises it") for line in err), err
    rc, out, err = domain(capsys, EXAMPLE, H100, dump, *release)
    assert rc == EXIT_UNKNOWN and out.startswith("<domain") and err[-1].startswith("pcitopo domain: unknown: devices: ")
    # a name some node advertises is there, permittedHostDevices or not
    rc, err = check(capsys, example_asking(tmp_path, "nvidia.com/GH100_H100_SXM5_80GB"), H100, dump, *release)
    assert rc == (EXIT_OK if drop == "key" else EXIT_CHECK_FAILED) and not any(": devices: " in line for line in err), err


def test_judge_names_is_virt_controllers_rule():
    """Permitted names: PCI, mediated and USB ones; DRA entries are not judged by name."""
    permitted = PermittedHostDevices((PermittedPCI("a.com/gpu", "10de:2330"),), ("a.com/vgpu", "a.com/usb"), True)
    vmi = {"spec": {"domain": {"devices": {
        "gpus": [{"name": "g", "deviceName": "a.com/gpu"}, {"name": "v", "deviceName": "a.com/vgpu"},
                 {"name": "d", "claimName": "c", "requestName": "r"}],
        "hostDevices": [{"name": "u", "deviceName": "a.com/usb"}, {"name": "x", "deviceName": "b.com/x"}]}}}}
    verdict = judge_names(vmi, permitted, [])
    assert [line.split(", which")[0] for line in verdict.failed] == ["devices: spec.domain.devices.hostDevices[1] asks for b.com/x"]
    assert judge_names(vmi, PermittedHostDevices(), [{"status": {"allocatable": {"b.com/x": "1", "a.com/gpu": "1",
                       "a.com/vgpu": "1", "a.com/usb": "1"}}}]) == judge_names({}, None, [])


# -- every VM of the project's cluster fixtures: the check's device verdict and preflight's agree --

def _vms(dump_path: Path):
    dump = read_dump([str(dump_path)])
    for obj in dump.workloads:
        name = f"{obj['metadata'].get('namespace')}/{obj['metadata']['name']}"
        vmi = as_vmi(obj, name)
        devices = vmi["spec"].get("domain", {}).get("devices", {})
        if devices.get("gpus") or devices.get("hostDevices"):
            yield name, obj, vmi, dump


CASES = [(d.name, name) for d in sorted(CLUSTERS.glob("*.yaml")) for name, *_ in _vms(d)]


@pytest.mark.parametrize("dump_name, vm", CASES, ids=[f"{d}:{v}" for d, v in CASES])
def test_every_fixture_vm_gets_one_device_verdict_from_check_domain_and_preflight(tmp_path, capsys, dump_name, vm):
    dump_path = CLUSTERS / dump_name
    name, obj, vmi, dump = next(c for c in _vms(dump_path) if c[0] == vm)
    names = judge_names(vmi, dump.kubevirt.permitted if dump.kubevirt else None, dump.nodes)
    manifest = tmp_path / "vm.json"
    manifest.write_text(json.dumps(obj))
    release = () if dump.kubevirt is not None and dump.kubevirt.version else ("--kubevirt", "v1.9.0")
    rc, err = check(capsys, manifest, H100, dump_path, *release)
    said = [line for line in err if line.startswith("xmlfix: check: devices: ")]
    unknown = [line for line in err if "unknown: devices: " in line]
    assert len(said) == len(names.failed) and bool(unknown) == bool(names.unknown and not names.failed), err
    if names.failed:
        assert rc == EXIT_CHECK_FAILED
    rc, _, err = domain(capsys, manifest, H100, dump_path, *release)
    assert (rc == EXIT_CHECK_FAILED) == bool(names.failed), err
    if dump.kubevirt is not None and dump.kubevirt.version:
        report = preflight(dump, target("kubevirt-v1.9.0"))
        w = next((w for w in report.workloads if w.name == name), None)
        refused = w is not None and "permittedHostDevices does not list" in w.before.cause
        assert refused == bool(names.failed), (w, names)


def test_the_cluster_fixtures_hold_a_vm_for_each_device_verdict():
    """The agreement test above sees permitted names and, on the dump without a CR, unknown ones."""
    verdicts = set()
    for d in CLUSTERS.glob("*.yaml"):
        for _, _, vmi, dump in _vms(d):
            v = judge_names(vmi, dump.kubevirt.permitted if dump.kubevirt else None, dump.nodes)
            verdicts.add("failed" if v.failed else "unknown" if v.unknown else "ok")
    assert {"ok", "unknown"} <= verdicts


def test_a_usb_device_the_cr_does_not_list_is_refused_by_name_not_called_a_modeless_pci_hostdev(tmp_path):
    doc = yaml.safe_load((CLUSTERS / "v1.9.0-foreign-plugin.yaml").read_text())
    doc["items"].append({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                         "metadata": {"name": "kiosk-0", "namespace": "vdi"},
                         "spec": {"domain": {"devices": {"hostDevices": [{"name": "token", "deviceName": "example.com/usb-token"}]}}}})
    path = tmp_path / "usb.yaml"
    path.write_text(yaml.safe_dump(doc))
    report = preflight(read_dump([str(path)]), target("kubevirt-v1.9.0"))
    kiosk = next(w for w in report.workloads if w.name == "vdi/kiosk-0")
    assert not kiosk.before.starts and "example.com/usb-token, which the KubeVirt CR's permittedHostDevices does not list" \
        in kiosk.before.cause and "mode" not in kiosk.before.cause
    assert not any("vdi/kiosk-0" in note for note in report.notes)  # not among kubevirt#18861's victims


# -- one rule for the node hook and the prediction ---------------------------------------------------

def test_a_resource_with_two_selectors_reaches_the_functions_of_both():
    """KubeVirt's device plugin offers every vfio-pci function of any selector of the name
    (discoverPermittedHostPCIDevices)."""
    host = open_host(H100)
    both = PermittedHostDevices((PermittedPCI("x.com/dev", "10de:2330"), PermittedPCI("x.com/dev", "15b3:1021")), (), True)
    r = reach(host, "hostDevices", "x.com/dev", both)
    ids = {host.function(b).ids for b in r.functions}
    assert r.known and ids == {"10de:2330", "15b3:1021"}
    assert len(r.functions) == sum(1 for f in host.functions() if f.driver == "vfio-pci" and f.ids in ids)
    guessed = reach(host, "gpus", "x.com/other", both)
    assert not guessed.known and {host.function(b).ids for b in guessed.functions} == {"10de:2330"}


def test_the_prediction_picks_within_what_the_node_hook_counts(tmp_path, capsys):
    """The functions ``pcitopo domain`` picks for a permitted resource are among the node hook's
    candidates for the same VMI (src/pcitopo/serve/plugin/devices.py), both from hostdevices.reach."""
    from pcitopo.serve.plugin.devices import requested_devices

    dump = read_dump([str(STRANGER)])
    vmi = example_asking(tmp_path, "nvidia.com/GH100_H100_SXM5_80GB")
    rc, out, err = domain(capsys, vmi, H100, STRANGER)
    assert rc == EXIT_OK
    picked = [line for line in err if "picked as" in line][0]
    gpus = {w.split()[1].rstrip(",") for w in picked.split(": ", 2)[2].split(", ua-") if "gpu-gpu" in w}
    req = requested_devices(as_vmi(yaml.safe_load(vmi.read_text()), "vm"), open_host(H100), dump.kubevirt.permitted)
    group = next(g for g in req.groups if g.what == "resource nvidia.com/GH100_H100_SXM5_80GB")
    assert group.known and len(gpus) == 8 and gpus <= {str(b) for b in group.candidates}


# -- a copy without driver or iommu_group links ---------------------------------------------------------

def _copy_without_links(tmp_path: Path) -> Path:
    from pcitopo.host.sources import MemoryTree

    out = tmp_path / "copy"
    MemoryTree.from_tarball(H100 / "sysfs.tar.gz").write_dir(out)
    for p in list(out.rglob("*")):
        if p.is_symlink() and p.name in ("driver", "iommu_group"):
            p.unlink()
    shutil.rmtree(out / "kernel" / "iommu_groups", ignore_errors=True)
    shutil.rmtree(out / "class" / "iommu", ignore_errors=True)
    return out


def test_a_copy_without_links_is_unknown_in_every_command_in_captures_words(tmp_path, capsys):
    copy_dir = _copy_without_links(tmp_path)
    assert pcitopo_main(["doctor", "--sysfs", str(copy_dir)]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert not any(line.startswith("FAIL") for line in lines), lines
    assert lines[0].startswith("UNKNOWN iommu       host: no IOMMU units and no IOMMU groups in ") and \
        lines[0].endswith("IOMMU off, or left out of the source (not a live /sys)")
    assert any(line.startswith("UNKNOWN vfio-driver 8 GPUs, 8 NICs with no driver link (bound to no driver, or left out "
                               "of the source)") for line in lines)
    assert pcitopo_main(["capture", "--sysfs", str(copy_dir), "-o", str(tmp_path / "c.tar.gz")]) == EXIT_OK
    warned = capsys.readouterr().err
    assert MISSING_COSTS["iommu_group"] in warned and MISSING_COSTS["driver"] in warned
    vmi = example_asking(tmp_path, "nvidia.com/GH100_H100_SXM5_80GB")  # a name the dump permits
    for sysfs in (copy_dir, tmp_path / "c.tar.gz"):  # the copy, and a capture of it: neither is whole
        rc, out, err = domain(capsys, vmi, sysfs, STRANGER)
        assert rc == EXIT_UNKNOWN and out.startswith("<domain"), err
        assert any("gives no driver for 16 device(s)" in line and "bound to no driver, or left out of the source" in line
                   for line in err), err
        assert not any("bound to no driver, not vfio-pci" in line for line in err)
        rc, err = check(capsys, vmi, sysfs, STRANGER)
        assert rc == EXIT_UNKNOWN and "sysfs gives no driver for 16 device(s) (0000:18:00.0, 0000:2a:00.0, 0000:3a:00.0, " \
            "and 13 more): bound to no driver, or left out of the source" in err[-1], err


def test_a_capture_of_a_whole_host_keeps_a_missing_link_a_failure(tmp_path, capsys):
    """A host built from its description (as a live sysfs is whole) with the IOMMU off: its
    capture records that it is whole, and the doctor fails it; a tarball written without the
    record (a copy) is unknown."""
    from pcitopo.synth import build_tree, parse_topo
    from pcitopo.synth.doctorfiles import iommu_off

    tree = build_tree(iommu_off(parse_topo((H100 / "host.topo").read_text(), "hgx-h100")))
    captured, _ = capture_tree(tree, 52)
    captured.write_tarball(tmp_path / "captured.tar.gz")
    tree.write_tarball(tmp_path / "copied.tar.gz")
    assert pcitopo_main(["doctor", "--sysfs", str(tmp_path / "captured.tar.gz")]) == EXIT_CHECK_FAILED
    assert capsys.readouterr().out.startswith("FAIL    iommu       host: IOMMU off")
    report = run_checks(open_host(tmp_path / "copied.tar.gz"))
    assert not report.failed and {f.check for f in report.findings if f.status == "unknown"} >= {"iommu", "vfio-driver", "iommu-group"}


# -- without --sysfs, the node is this machine, and xmlfix says so --------------------------------------

def test_xmlfix_without_sysfs_names_this_machines_sys(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PCITOPO_SYSFS", raising=False)
    domain_xml = REPO / "fixtures" / "hgx-b200" / "examples" / "vmi-gpu" / "domain.xml"
    rc = xmlfix_main(["--check", str(domain_xml)])
    err = capsys.readouterr().err.splitlines()
    if rc == EXIT_BAD_INPUT:  # this machine has no such devices (the usual case)
        assert err[-1].endswith("; read this machine's /sys: no --sysfs given"), err
    else:
        assert err[-1].endswith("read this machine's /sys: no --sysfs given"), err
    rc = xmlfix_main(["--check", "--sysfs", str(REPO / "fixtures" / "hgx-b200"), str(domain_xml)])
    assert "this machine" not in capsys.readouterr().err


def test_a_name_nobody_advertises_is_said_before_any_driver_binding(tmp_path, capsys):
    """Without permittedHostDevices, nvidia.com/GB100_B200 is guessed as 10de:2901, which the H200
    node lacks: the one line leads with the name the cluster may not have."""
    rc, out, err = domain(capsys, example_asking(tmp_path, "nvidia.com/GB100_B200"), H200, dump_without(tmp_path, "key"))
    assert rc == EXIT_BAD_INPUT and out == ""
    assert err[-1].startswith("pcitopo domain: devices: spec.domain.devices.gpus[0] and 7 more ask for nvidia.com/GB100_B200: "
                              "the dump's KubeVirt CR has no permittedHostDevices") and err[-1].endswith(
        "and on this node: spec.domain.devices.gpus[0]: the node has no free nvidia.com/GB100_B200 gpu bound to vfio-pci for ua-gpu-gpu0")
