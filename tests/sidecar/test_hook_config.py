"""Hook options from VMI annotations, and the VMI JSON they come in."""

from __future__ import annotations

import json

import pytest

from pcitopo.errors import ConfigError, PcitopoError
from pcitopo.serve.options import PREFIX, HookOptions, VmiError, describe_options, options_from_vmi, parse_vmi


def vmi(annotations=None, **meta) -> bytes:
    m = {"name": "gpu-vm", "namespace": "ml", **meta}
    if annotations is not None:
        m["annotations"] = annotations
    return json.dumps({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": m, "spec": {}}).encode()


def test_defaults_without_annotations_or_without_a_vmi():
    for doc in (vmi(), vmi({}), None, b""):
        facts, opts = options_from_vmi(doc)
        assert (opts.mode, opts.on_error) == ("mirror", "fail")
    facts, _ = options_from_vmi(vmi())
    assert facts.ref == "ml/gpu-vm"
    assert parse_vmi(None).ref == "-/-"


@pytest.mark.parametrize("mode", ["mirror", "off"])
@pytest.mark.parametrize("on_error", ["fail", "passthrough"])
def test_every_allowed_value(mode, on_error):
    _, opts = options_from_vmi(vmi({f"{PREFIX}mode": mode, f"{PREFIX}on-error": on_error}))
    assert (opts.mode, opts.on_error) == (mode, on_error)


def test_other_annotations_are_ignored():
    _, opts = options_from_vmi(vmi({"kubevirt.io/placePCIDevicesOnRootComplex": "true", "pcitopo.example/mode": "x",
                                    "hooks.kubevirt.io/hookSidecars": "[]"}))
    assert opts == HookOptions()


@pytest.mark.parametrize(
    "key,value,needles",
    [
        ("mode", "mirorr", ["pcitopo.kubevirt.io/mode", "'mirorr'", "mirror | off"]),
        ("mode", "Mirror", ["pcitopo.kubevirt.io/mode", "mirror | off"]),
        ("mode", "", ["pcitopo.kubevirt.io/mode", "''", "mirror | off"]),
        ("on-error", "ignore", ["pcitopo.kubevirt.io/on-error", "'ignore'", "fail | passthrough"]),
        ("on-error", "passthrough ", ["pcitopo.kubevirt.io/on-error", "fail | passthrough"]),
        ("on-eror", "fail", ["unknown annotation pcitopo.kubevirt.io/on-eror", "pcitopo.kubevirt.io/mode", "pcitopo.kubevirt.io/on-error"]),
        ("on_error", "fail", ["unknown annotation pcitopo.kubevirt.io/on_error"]),
    ],
)
def test_a_bad_annotation_names_itself_and_the_allowed_values(key, value, needles):
    with pytest.raises(ConfigError) as ei:
        options_from_vmi(vmi({PREFIX + key: value}))
    msg = str(ei.value)
    assert "\n" not in msg and ei.value.reason == msg
    for n in needles:
        assert n in msg, msg


def test_a_hostile_annotation_value_is_shown_truncated_on_one_line():
    with pytest.raises(ConfigError) as ei:
        options_from_vmi(vmi({f"{PREFIX}mode": "x\n" * 5000}))
    assert "\n" not in str(ei.value) and len(str(ei.value)) < 200


@pytest.mark.parametrize(
    "doc,needle",
    [
        (b"{not json", "VMI JSON is malformed"),
        (b"\xff\xfe\x00garbage", "VMI JSON is malformed"),
        (b"[1, 2]", "is a list, not an object"),
        (b'"vmi"', "is a str, not an object"),
        (b"null", "is a NoneType, not an object"),
        (b'{"metadata": []}', "metadata is not an object"),
        (b'{"metadata": {"annotations": ["a"]}}', "metadata.annotations is not an object"),
        (b'{"metadata": {"annotations": {"pcitopo.kubevirt.io/mode": 1}}}', "annotation pcitopo.kubevirt.io/mode is not a string"),
        (b'{"metadata": {"name": 5}}', "metadata.name is not a string"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ],
)
def test_malformed_vmi_json_is_a_typed_one_line_error(doc, needle):
    with pytest.raises(VmiError) as ei:
        options_from_vmi(doc)
    assert isinstance(ei.value, ConfigError) and isinstance(ei.value, PcitopoError)
    assert ei.value.kind == "vmi"
    assert needle in str(ei.value) and "\n" not in str(ei.value)


def test_null_metadata_and_annotations_mean_none():
    assert options_from_vmi(b'{"metadata": null}')[1] == HookOptions()
    assert options_from_vmi(b'{"metadata": {"annotations": null}}')[1] == HookOptions()


def test_describe_options_documents_every_option():
    rows = {r[0]: r for r in describe_options()}
    assert rows[f"{PREFIX}mode"][1:3] == (("mirror", "off"), "mirror")
    assert rows[f"{PREFIX}on-error"][1:3] == (("fail", "passthrough"), "fail")
    assert set(rows) == {PREFIX + (f.alias or n) for n, f in HookOptions.model_fields.items()}


def test_an_options_annotation_is_its_field_name_spelled_with_dashes():
    """One declaration per option: the annotation name comes from the field (its alias), so a
    new field is a new annotation with no table to update."""
    from pcitopo.serve.options import annotation

    for name, f in HookOptions.model_fields.items():
        assert f.alias == name.replace("_", "-")
        assert annotation(name) == PREFIX + f.alias
    assert annotation("on_error") == "pcitopo.kubevirt.io/on-error"
    with pytest.raises(ConfigError, match="unknown annotation pcitopo.kubevirt.io/on_error"):
        options_from_vmi(vmi({f"{PREFIX}on_error": "fail"}))  # the field name is not an annotation
