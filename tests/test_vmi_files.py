"""`xmlfix --vmi` reads the VMI files people keep: a multi-document YAML with the VM beside its
ConfigMap; bad label values are bad input (exit 2) as bad annotation values are; the Plugin's
label written among the annotations says where labels go, at the CLI and in the hook."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pcitopo.errors import ConfigError
from pcitopo.kubevirt.manifest import vmi_as_json
from pcitopo.serve.options import options_from_annotations
from testkit import REPO

BIN = Path(sys.executable).parent
B200 = REPO / "fixtures" / "hgx-b200"
DOMAIN = B200 / "examples" / "vmi-gpu" / "domain.xml"
VMI = (REPO / "deploy" / "vmi-gpu.yaml").read_text()
VM = (REPO / "deploy" / "vm-gpu.yaml").read_text()
CONFIGMAP = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: nccl-env\ndata:\n  NCCL_DEBUG: \"INFO\"\n"
SECRET = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: pull\nstringData:\n  token: \"x\"\n"


def xmlfix_check(vmi: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "xmlfix"), "--check", "--sysfs", str(B200), "--vmi", str(vmi), str(DOMAIN)],
                          capture_output=True, text=True, timeout=300)


def write(tmp_path: Path, *docs: str) -> Path:
    path = tmp_path / "vmi.yaml"
    path.write_text("---\n" + "\n---\n".join(d.strip("\n") for d in docs) + "\n")
    return path


# -- multi-document files --------------------------------------------------------------------------

def test_a_vmi_kept_with_its_configmap_is_read_as_the_vmi_alone(tmp_path):
    both = write(tmp_path, VMI, CONFIGMAP)
    assert json.loads(vmi_as_json(both.read_bytes(), "vmi.yaml")) == json.loads(vmi_as_json(VMI.encode(), "vmi.yaml"))
    r = xmlfix_check(both)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("xmlfix: check: ok:")


def test_a_vm_after_a_configmap_and_a_secret_is_read_as_its_vmi(tmp_path):
    data = write(tmp_path, CONFIGMAP, SECRET, VM).read_bytes()
    vmi = json.loads(vmi_as_json(data, "vm.yaml"))
    assert vmi["kind"] == "VirtualMachineInstance"
    assert vmi == json.loads(vmi_as_json(VM.encode(), "vm.yaml"))


def test_two_vms_in_one_file_are_refused_in_one_line_naming_both(tmp_path):
    other = VMI.replace("name: train-0", "name: train-1")
    r = xmlfix_check(write(tmp_path, VMI, CONFIGMAP, other))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "2 VirtualMachine/VirtualMachineInstance documents" in r.stderr
    assert "VirtualMachineInstance train-0" in r.stderr and "VirtualMachineInstance train-1" in r.stderr


def test_a_file_without_a_vm_is_refused_in_one_line_naming_its_kinds(tmp_path):
    r = xmlfix_check(write(tmp_path, CONFIGMAP, SECRET))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "2 YAML documents (ConfigMap, Secret) and none is a VirtualMachineInstance" in r.stderr


def test_empty_documents_around_a_single_vmi_do_not_count(tmp_path):
    path = tmp_path / "vmi.yaml"
    path.write_text("---\n" + VMI + "\n---\n# nothing here\n")
    assert xmlfix_check(path).returncode == 0


# -- label and annotation values are strings: one mistake, one exit code ----------------------------

def test_an_unquoted_label_is_bad_input_as_an_unquoted_annotation_is(tmp_path):
    label = tmp_path / "label.yaml"
    label.write_text(VMI.replace('pcitopo.kubevirt.io/plugin: "true"', "pcitopo.kubevirt.io/plugin: true"))
    annotation = tmp_path / "annotation.yaml"
    annotation.write_text(VMI.replace('pcitopo.kubevirt.io/mode: "mirror"', "pcitopo.kubevirt.io/mode: off"))
    for path, what, key, raw in ((label, "label", "pcitopo.kubevirt.io/plugin", "true"),
                                 (annotation, "annotation", "pcitopo.kubevirt.io/mode", "off")):
        r = xmlfix_check(path)
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
        assert (f"YAML reads the unquoted {raw} of {what} {key} as a boolean, but {what}s are strings: "
                f'quote it ({key}: "{raw}")') in r.stderr


def test_a_json_label_that_is_not_a_string_is_bad_input():
    doc = json.loads(vmi_as_json(VMI.encode(), "vmi.yaml"))
    doc["metadata"]["labels"]["pcitopo.kubevirt.io/plugin"] = True
    with pytest.raises(ConfigError, match="VMI JSON label pcitopo.kubevirt.io/plugin is not a string"):
        vmi_as_json(json.dumps(doc).encode(), "vmi.json")


# -- the Plugin's label among the annotations -------------------------------------------------------

def test_the_plugin_label_among_annotations_says_it_is_a_label_and_where_labels_go(tmp_path):
    path = tmp_path / "vmi.yaml"
    path.write_text(VMI.replace('pcitopo.kubevirt.io/mode: "mirror"', 'pcitopo.kubevirt.io/plugin: "true"'))
    r = xmlfix_check(path)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "unknown annotation pcitopo.kubevirt.io/plugin: pcitopo.kubevirt.io/plugin is a label, not an annotation" in r.stderr
    assert "metadata.labels" in r.stderr and "spec.template.metadata.labels" in r.stderr
    # the hook reads the same annotations and refuses them with the same sentence
    with pytest.raises(ConfigError, match=r"is a label, not an annotation: labels go under metadata.labels"):
        options_from_annotations({"pcitopo.kubevirt.io/plugin": "true"})


def test_another_unknown_annotation_still_lists_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown annotation pcitopo.kubevirt.io/plugins \(known: "):
        options_from_annotations({"pcitopo.kubevirt.io/plugins": "true"})


def test_the_plugin_label_among_a_vms_own_annotations_says_where_labels_go_not_where_annotations_go(tmp_path):
    path = tmp_path / "vm.yaml"
    path.write_text(VM.replace("metadata:\n", 'metadata:\n  annotations:\n    pcitopo.kubevirt.io/plugin: "true"\n', 1))
    with pytest.raises(ConfigError) as e:
        vmi_as_json(path.read_bytes(), "vm.yaml")
    assert "pcitopo.kubevirt.io/plugin is a label, not an annotation" in str(e.value)
    assert "spec.template.metadata.labels" in str(e.value) and "move it to spec.template.metadata.annotations" not in str(e.value)
