"""Build the grpc-go clients (tests/sidecar/goclient/main.go for the hook sidecar,
tests/sidecar/goclient/plugin/main.go for the Plugin) with Debian's Go packages.

The Go stubs are generated from proto/testkit/hookproto/*.proto (wire-identical to KubeVirt's
pkg/hooks/info and pkg/hooks/v1alpha1..3 .proto files) by protoc with Debian's protoc-gen-go and
protoc-gen-go-grpc, and compiled in GOPATH mode against Debian's golang-google-grpc-dev and
golang-google-protobuf-dev (no module proxy is needed or reachable). The binary is cached under
.cache/goclient/<hash of the inputs and tool versions>/, so only the first run pays the build.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from testkit import REPO

PROTO_DIR = REPO / "proto" / "testkit" / "hookproto"
# program -> its source: the hook sidecar's client (virt-launcher's hook manager) and the Plugin's
# (virt-launcher's domain-hook client and virt-handler's node-hook client).
PROGRAMS = {
    "hookclient": REPO / "tests" / "sidecar" / "goclient" / "main.go",
    "pluginclient": REPO / "tests" / "sidecar" / "goclient" / "plugin" / "main.go",
}
DEBIAN_GOPATH = Path("/usr/share/gocode")
TOOLS = ("go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc")
# The Debian packages the build uses (scripts/setup-debian.sh installs them); their versions are
# part of the cache key. grpc-go 1.33 marshals through github.com/golang/protobuf, which must be
# the 1.5 line (a wrapper over google.golang.org/protobuf) for protoc-gen-go 1.28's messages:
# with the 1.3 line the client panics on the first reply.
GO_PACKAGES = (
    "golang-go", "golang-google-grpc-dev", "golang-google-protobuf-dev",
    "golang-github-golang-protobuf-1-5-dev", "protoc-gen-go", "protoc-gen-go-grpc", "protobuf-compiler",
)
# proto file -> Go import path of its generated package (GOPATH mode: a directory under src/).
PACKAGES = {
    "info.proto": "pcitopo/hooks/info",
    "v1alpha1.proto": "pcitopo/hooks/v1alpha1",
    "v1alpha2.proto": "pcitopo/hooks/v1alpha2",
    "v1alpha3.proto": "pcitopo/hooks/v1alpha3",
    "plugins_v1alpha1.proto": "pcitopo/hooks/plugins",
}


def missing_tools() -> list[str]:
    out = [t for t in TOOLS if shutil.which(t) is None]
    for pkg in ("google.golang.org/grpc", "google.golang.org/protobuf", "github.com/golang/protobuf/proto/wrappers.go"):
        if not (DEBIAN_GOPATH / "src" / pkg).exists():
            out.append(pkg)
    return out


def _go_env(gopath: Path, cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GOPATH=f"{gopath}{os.pathsep}{DEBIAN_GOPATH}",
        GO111MODULE="off",
        GOFLAGS="",
        GOPROXY="off",
        GOCACHE=str(cache),
        CGO_ENABLED="0",
    )
    return env


def _inputs_key() -> str:
    h = hashlib.sha256()
    programs = [p for main in PROGRAMS.values() for p in sorted(main.parent.glob("*.go"))]
    for p in [*programs, Path(__file__), *sorted(PROTO_DIR.glob("*.proto"))]:
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    h.update(subprocess.run(["dpkg-query", "-W", *GO_PACKAGES], capture_output=True).stdout)
    for cmd in (["go", "version"], ["protoc", "--version"]):
        h.update(subprocess.run(cmd, capture_output=True, check=True).stdout)
    return h.hexdigest()[:16]


def build_hookclient() -> Path:
    """The hookclient binary, built once per set of inputs."""
    return build_client("hookclient")


def build_client(program: str) -> Path:
    """One of PROGRAMS, built once per set of inputs (all of them share one GOPATH)."""
    base = REPO / ".cache" / "goclient" / _inputs_key()
    binary = base / program
    if binary.is_file():
        return binary
    gopath = base / "gopath"
    src = gopath / "src"
    src.mkdir(parents=True, exist_ok=True)
    mappings = [f"M{name}={pkg}" for name, pkg in PACKAGES.items()]
    subprocess.run(
        ["protoc", f"-I{PROTO_DIR}", f"--go_out={src}", f"--go-grpc_out={src}"]
        + [f"--go_opt={m}" for m in mappings]
        + [f"--go-grpc_opt={m}" for m in mappings]
        + sorted(PACKAGES),
        check=True, capture_output=True, cwd=PROTO_DIR,
    )
    (src / "pcitopo" / program).mkdir(parents=True, exist_ok=True)
    for source in sorted(PROGRAMS[program].parent.glob("*.go")):  # the program is its folder's Go files
        shutil.copyfile(source, src / "pcitopo" / program / source.name)
    tmp = base / f"{program}.tmp"
    r = subprocess.run(
        ["go", "build", "-o", str(tmp), f"pcitopo/{program}"],
        env=_go_env(gopath, base / f"gocache-{program}"), capture_output=True, cwd=base, timeout=900,
    )
    if r.returncode != 0:
        raise RuntimeError(f"go build failed:\n{r.stderr.decode(errors='replace')}")
    tmp.rename(binary)
    shutil.rmtree(base / f"gocache-{program}", ignore_errors=True)
    return binary


if __name__ == "__main__":
    print(build_hookclient())


def hookclient_or_skip(program: str = "hookclient") -> Path:
    """The built client for a test: skipped where the Go toolchain is missing, failed under CI
    (where scripts/setup-debian.sh must have installed it)."""
    import pytest

    missing = missing_tools()
    if missing:
        msg = f"Go toolchain missing ({', '.join(missing)}): run scripts/setup-debian.sh"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return build_client(program)
