"""Our .proto files are wire-identical to KubeVirt's, and the committed Python code is exactly
what grpcio-tools generates from them."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

REPO = Path(__file__).resolve().parents[2]


def _load_generator():
    spec = importlib.util.spec_from_file_location("pcitopo_proto_generate", REPO / "proto" / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


generate = _load_generator()  # proto/generate.py

# KubeVirt's wire API (pkg/hooks/info/api_info.proto, pkg/hooks/v1alpha{1,2,3}/api_v1alpha*.proto;
# docs/SOURCES.md, "KubeVirt hook API"), written out independently of our .proto files: package -> service -> rpc -> (request, response),
# and every message's fields as (name, number, type, repeated).
B, S, I32, MSG = "bytes", "string", "int32", "message"
ON_DEFINE = {
    "OnDefineDomainParams": [("domainXML", 1, B, False), ("vmi", 2, B, False)],
    "OnDefineDomainResult": [("domainXML", 1, B, False)],
}
CLOUD_INIT = {
    "PreCloudInitIsoParams": [("cloudInitNoCloudSource", 1, B, False), ("vmi", 2, B, False), ("cloudInitData", 3, B, False)],
    "PreCloudInitIsoResult": [("cloudInitNoCloudSource", 1, B, False), ("cloudInitData", 3, B, False)],
}
WIRE = {
    "info": (
        "kubevirt.hooks.info",
        {"Info": {"Info": ("InfoParams", "InfoResult")}},
        {
            "InfoParams": [],
            "InfoResult": [("name", 1, S, False), ("hookPoints", 3, MSG, True), ("versions", 4, S, True)],
            "HookPoint": [("name", 1, S, False), ("priority", 2, I32, False)],
        },
    ),
    "v1alpha1": (
        "kubevirt.hooks.v1alpha1",
        {"Callbacks": {"OnDefineDomain": ("OnDefineDomainParams", "OnDefineDomainResult")}},
        ON_DEFINE,
    ),
    "v1alpha2": (
        "kubevirt.hooks.v1alpha2",
        {"Callbacks": {
            "OnDefineDomain": ("OnDefineDomainParams", "OnDefineDomainResult"),
            "PreCloudInitIso": ("PreCloudInitIsoParams", "PreCloudInitIsoResult"),
        }},
        {**ON_DEFINE, **CLOUD_INIT},
    ),
    "v1alpha3": (
        "kubevirt.hooks.v1alpha3",
        {"Callbacks": {
            "OnDefineDomain": ("OnDefineDomainParams", "OnDefineDomainResult"),
            "PreCloudInitIso": ("PreCloudInitIsoParams", "PreCloudInitIsoResult"),
            "Shutdown": ("ShutdownParams", "ShutdownResult"),
        }},
        {**ON_DEFINE, **CLOUD_INIT, "ShutdownParams": [], "ShutdownResult": []},
    ),
    # KubeVirt Plugins (VEP 190): pkg/hooks/plugins/v1alpha1/api.proto at v1.9.0.
    "plugins_v1alpha1": (
        "kubevirt.hooks.plugins.v1alpha1",
        {
            "DomainHookService": {"MutateDomain": ("MutateDomainRequest", "MutateDomainResponse")},
            "NodeHookService": {"ExecuteNodeHook": ("ExecuteNodeHookRequest", "ExecuteNodeHookResponse")},
        },
        {
            "MutateDomainRequest": [("domain_type", 1, S, False), ("domain", 2, B, False), ("vmi", 3, B, False),
                                    ("sidecar_context", 4, MSG, False)],
            "SidecarContext": [("invocation_context", 1, S, False)],
            "MutateDomainResponse": [("domain", 1, B, False)],
            "ExecuteNodeHookRequest": [("hookPoint", 1, S, False), ("vmi", 2, B, False), ("node_context", 3, MSG, False)],
            "NodeContext": [("node_name", 1, S, False)],
            "ExecuteNodeHookResponse": [],
        },
    ),
}
_TYPE = {
    descriptor_pb2.FieldDescriptorProto.TYPE_BYTES: B,
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING: S,
    descriptor_pb2.FieldDescriptorProto.TYPE_INT32: I32,
    descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE: MSG,
}


def _file_proto(stem: str) -> descriptor_pb2.FileDescriptorProto:
    mod = importlib.import_module(f"testkit.hookproto.{stem}_pb2")
    fdp = descriptor_pb2.FileDescriptorProto()
    fdp.ParseFromString(mod.DESCRIPTOR.serialized_pb)
    return fdp


@pytest.mark.parametrize("stem", sorted(WIRE))
def test_wire_names_and_field_numbers_match_kubevirt(stem):
    package, services, messages = WIRE[stem]
    fdp = _file_proto(stem)
    assert fdp.package == package
    assert fdp.syntax == "proto3"
    got_services = {
        s.name: {m.name: (m.input_type.rsplit(".", 1)[-1], m.output_type.rsplit(".", 1)[-1]) for m in s.method}
        for s in fdp.service
    }
    assert got_services == services
    for s in fdp.service:
        for m in s.method:
            assert m.input_type.startswith(f".{package}.") and m.output_type.startswith(f".{package}.")
            assert not m.client_streaming and not m.server_streaming
    got_messages = {
        m.name: [(f.name, f.number, _TYPE[f.type], f.label == f.LABEL_REPEATED) for f in m.field]
        for m in fdp.message_type
    }
    assert got_messages == messages
    if stem == "plugins_v1alpha1":  # the reserved field of SidecarContext stays reserved
        ctx = next(m for m in fdp.message_type if m.name == "SidecarContext")
        assert [(r.start, r.end) for r in ctx.reserved_range] == [(2, 3)]
    if stem == "info":
        hp = next(f for f in fdp.message_type[1].field if f.name == "hookPoints")
        assert hp.type_name == ".kubevirt.hooks.info.HookPoint"


def test_method_paths_are_the_ones_virt_launcher_calls():
    """The full gRPC paths, as in the generated stubs' channel.unary_unary calls."""
    paths = set()
    for stem in WIRE:
        text = (REPO / "testkit" / "hookproto" / f"{stem}_pb2_grpc.py").read_text()
        paths |= {line.strip().strip("',") for line in text.splitlines() if line.strip().startswith("'/kubevirt.")}
    assert paths == {
        "/kubevirt.hooks.info.Info/Info",
        "/kubevirt.hooks.v1alpha1.Callbacks/OnDefineDomain",
        "/kubevirt.hooks.v1alpha2.Callbacks/OnDefineDomain",
        "/kubevirt.hooks.v1alpha2.Callbacks/PreCloudInitIso",
        "/kubevirt.hooks.v1alpha3.Callbacks/OnDefineDomain",
        "/kubevirt.hooks.v1alpha3.Callbacks/PreCloudInitIso",
        "/kubevirt.hooks.v1alpha3.Callbacks/Shutdown",
        "/kubevirt.hooks.plugins.v1alpha1.DomainHookService/MutateDomain",
        "/kubevirt.hooks.plugins.v1alpha1.NodeHookService/ExecuteNodeHook",
    }


def test_committed_descriptors_equal_the_proto_files(tmp_path):
    """Whatever grpcio-tools version is installed: the descriptors compiled into the committed
    modules are exactly what protoc makes of the .proto files today."""
    from grpc_tools import protoc

    out = tmp_path / "set.pb"
    rc = protoc.main([
        "protoc", f"-I{generate.PROTO_ROOT}", f"--descriptor_set_out={out}",
        *(str(generate.PROTO_ROOT / generate.PROTO_PACKAGE_DIR / p) for p in generate.PROTOS),
    ])
    assert rc == 0
    fresh = descriptor_pb2.FileDescriptorSet()
    fresh.ParseFromString(out.read_bytes())
    by_stem = {Path(f.name).stem: f for f in fresh.file}
    for f in fresh.file:  # protoc adds json_name to descriptor sets, not to generated code
        for m in f.message_type:
            for fld in m.field:
                fld.ClearField("json_name")
    for stem in WIRE:
        assert _file_proto(stem) == by_stem[stem], stem


def test_committed_code_is_exactly_fresh_grpcio_tools_output(tmp_path):
    have = generate.generator_version()
    assert have == generate.GENERATOR, (
        f"grpcio-tools {have} is installed but the committed code was generated with {generate.GENERATOR}: "
        f"pin grpcio-tools=={generate.GENERATOR} in the test extras, or regenerate deliberately "
        "(python proto/generate.py) and bump GENERATOR"
    )
    r = subprocess.run([sys.executable, str(REPO / "proto" / "generate.py"), str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    committed_dir = REPO / "testkit" / "hookproto"
    expected = {Path(rel).name for rel in generate.generated_files()}
    on_disk = {p.name for p in committed_dir.glob("*_pb2*.py")}
    assert on_disk == expected, "stray or missing generated modules"
    for rel in generate.generated_files():
        assert (tmp_path / rel).read_bytes() == (REPO / rel).read_bytes(), f"{rel} differs from a fresh generation"
