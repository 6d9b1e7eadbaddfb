#!/usr/bin/env python3
"""Generate the Python gRPC code for KubeVirt's hook API from the .proto files in this folder.

The generated code belongs to the test kit: the clients in tests/ and bench/ speak to the server
through it, while the server reads and writes the messages itself (``pcitopo.serve.wire``), so
neither this code nor protobuf's runtime is in the package or the image.

The .proto files live at ``proto/testkit/hookproto/*.proto`` so that protoc, run with
``-I proto``, writes modules whose imports already name their home (``from testkit.hookproto
import info_pb2``): protoc writes them below ``testkit/hookproto/`` of a temporary folder, and
they are copied into ``testkit/hookproto/`` exactly as grpcio-tools prints them, with no
post-processing; ``tests/sidecar/test_hook_proto.py`` regenerates them into a temporary folder
and compares byte for byte.

Usage: python proto/generate.py [OUT_ROOT]    (default: the repository root)

The output depends on the grpcio-tools version (it stamps its protobuf and grpcio versions into
the code and the code checks them at import), so the version used is pinned in GENERATOR below
and checked here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
REPO_ROOT = PROTO_ROOT.parent
PACKAGE_DIR = "testkit/hookproto"  # where the generated modules are committed
PROTO_PACKAGE_DIR = "testkit/hookproto"  # where the .proto files are, below proto/
PROTOS = ("info.proto", "v1alpha1.proto", "v1alpha2.proto", "v1alpha3.proto", "plugins_v1alpha1.proto")
# The grpcio-tools release the committed code was generated with.
GENERATOR = "1.85.1"


def generated_files() -> list[str]:
    """Paths (relative to the output root) of every file protoc writes."""
    out = []
    for proto in PROTOS:
        stem = proto[: -len(".proto")]
        out += [f"{PACKAGE_DIR}/{stem}_pb2.py", f"{PACKAGE_DIR}/{stem}_pb2_grpc.py"]
    return out


def generator_version() -> str:
    from grpc_tools import grpc_version  # type: ignore[import-untyped]

    return grpc_version.VERSION


def generate(out_root: str | os.PathLike) -> None:
    import shutil
    import tempfile

    from grpc_tools import protoc  # type: ignore[import-untyped]

    out_root = os.fspath(out_root)
    os.makedirs(os.path.join(out_root, PACKAGE_DIR), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            *(str(PROTO_ROOT / PROTO_PACKAGE_DIR / p) for p in PROTOS),
        ]
        rc = protoc.main(args)
        if rc != 0:
            raise SystemExit(f"protoc failed with exit code {rc}")
        for rel in generated_files():
            shutil.copyfile(os.path.join(tmp, PROTO_PACKAGE_DIR, os.path.basename(rel)), os.path.join(out_root, rel))


def main(argv: list[str]) -> int:
    out_root = argv[1] if len(argv) > 1 else str(REPO_ROOT)
    have = generator_version()
    if have != GENERATOR:
        print(
            f"generate.py: grpcio-tools {have} installed, the committed code is pinned to "
            f"{GENERATOR}; install grpcio-tools=={GENERATOR} (or bump GENERATOR deliberately)",
            file=sys.stderr,
        )
        return 2
    generate(out_root)
    for rel in generated_files():
        print(os.path.join(out_root, rel))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
