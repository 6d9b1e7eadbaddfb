"""The server against an independent client, as virt-launcher calls it.

``hookclient`` (tests/sidecar/goclient/main.go) is a grpc-go program whose stubs are generated
from the hook .proto files by Debian's protoc-gen-go/protoc-gen-go-grpc and compiled against
Debian's grpc-go (testkit/goclient.py). It dials the bare socket path with a unix dialer,
insecure, authority "localhost", a fresh connection per call, Info with a 1 s deadline, exactly
like KubeVirt's hook manager. Our own Python client shares the generated Python code with the
server, so it cannot catch a wire mistake both sides make; this one can.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from testkit.goclient import PACKAGES, PROTO_DIR, hookclient_or_skip
from testkit.hookkit import fixture_domain, fixture_sysfs, vmi_json, xmlfix
from testkit.server_proc import ServerProcess, serve_argv, wait_for_socket

VERSIONS = ("v1alpha1", "v1alpha2", "v1alpha3")


@pytest.fixture(scope="module")
def hookclient() -> Path:
    return hookclient_or_skip()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`pcitopo serve` on hook-sidecar-0/pcitopo.sock in a short path (sun_path is 108 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="pcitopo-go-"))
    (d / "hook-sidecar-0").mkdir()
    sock = d / "hook-sidecar-0" / "pcitopo.sock"
    srv = ServerProcess(serve_argv(sock, fixture_sysfs("hgx-b200")), tmp_path_factory.mktemp("go") / "server.log", socket=sock)
    wait_for_socket(sock, proc=srv.proc)
    yield srv
    srv.stop()
    shutil.rmtree(d, ignore_errors=True)


def call(client: Path, socket: Path, *args: str) -> tuple[int, dict]:
    r = subprocess.run([str(client), "-socket", str(socket), *args], capture_output=True, timeout=120)
    lines = r.stdout.decode().strip().splitlines()
    assert lines, f"hookclient printed nothing (exit {r.returncode}): {r.stderr.decode(errors='replace')[:2000]}"
    return r.returncode, json.loads(lines[-1])


def test_stubs_are_generated_for_kubevirts_service_names(hookclient):
    """The Go stubs name the RPCs by KubeVirt's package and service names."""
    src = hookclient.parent / "gopath" / "src"
    text = "".join(p.read_text() for p in src.rglob("*_grpc.pb.go"))
    for method in ("/kubevirt.hooks.info.Info/Info", "/kubevirt.hooks.v1alpha1.Callbacks/OnDefineDomain",
                   "/kubevirt.hooks.v1alpha2.Callbacks/OnDefineDomain", "/kubevirt.hooks.v1alpha3.Callbacks/OnDefineDomain",
                   "/kubevirt.hooks.v1alpha3.Callbacks/Shutdown"):
        assert f'"{method}"' in text, method
    assert PROTO_DIR.is_dir() and set(PACKAGES) == {p.name for p in PROTO_DIR.glob("*.proto")}


def test_go_client_info_and_negotiation(hookclient, server):
    """Info within virt-launcher's 1 s deadline; the newest common version wins."""
    rc, rep = call(hookclient, server.socket)
    assert rc == 0, rep
    assert rep["info"] == {
        "name": "pcitopo",
        "hookPoints": [{"name": "OnDefineDomain", "priority": 0}, {"name": "Shutdown", "priority": 0}],
        "versions": ["v1alpha3", "v1alpha2", "v1alpha1"],
    }
    assert rep["version"] == "v1alpha3"


@pytest.mark.parametrize("case", [None, "kubevirt-numa", "no-numa"])
@pytest.mark.parametrize("version", VERSIONS)
def test_go_client_gets_xmlfix_bytes_on_every_version(hookclient, server, tmp_path, case, version):
    """OnDefineDomain through grpc-go returns exactly what `xmlfix` prints."""
    domain = fixture_domain("hgx-b200", case)
    vmi = vmi_json(domain)
    (tmp_path / "in.xml").write_bytes(domain)
    (tmp_path / "vmi.json").write_bytes(vmi)
    out = tmp_path / "out.xml"
    rc, rep = call(hookclient, server.socket, "-version", version, "-domain", str(tmp_path / "in.xml"),
                   "-vmi", str(tmp_path / "vmi.json"), "-out", str(out))
    assert rc == 0 and rep["defined"] and rep["version"] == version, rep
    expected = xmlfix(domain, fixture_sysfs("hgx-b200"), vmi, tmp_path)
    assert expected.returncode == 0, expected.stderr
    assert out.read_bytes() == expected.stdout
    assert out.read_bytes() != domain
    last = [r for r in server.log_lines() if r.get("event") == "OnDefineDomain"][-1]
    assert last["version"] == version and last["outcome"] == "rewritten"


def test_go_client_sees_a_bad_domain_as_a_grpc_error(hookclient, server, tmp_path):
    """A refused domain is a status grpc-go reads (code and one-line reason)."""
    domain = fixture_domain("hgx-b200").replace(b'bus="0x1b" slot="0x00"', b'bus="0x77" slot="0x00"', 1)
    (tmp_path / "in.xml").write_bytes(domain)
    (tmp_path / "vmi.json").write_bytes(vmi_json(domain))
    rc, rep = call(hookclient, server.socket, "-domain", str(tmp_path / "in.xml"), "-vmi", str(tmp_path / "vmi.json"),
                   "-out", str(tmp_path / "out.xml"))
    assert rc == 1 and not rep["defined"]
    assert "code = InvalidArgument" in rep["error"] and "0000:77:00.0" in rep["error"], rep
    assert not (tmp_path / "out.xml").exists()


def test_go_client_shutdown_stops_the_server(hookclient, tmp_path):
    """V1alpha3 Shutdown from grpc-go stops the server and removes its socket."""
    d = Path(tempfile.mkdtemp(prefix="pcitopo-go-"))
    try:
        sock = d / "pcitopo.sock"
        srv = ServerProcess(serve_argv(sock, fixture_sysfs("hgx-b200")), tmp_path / "server.log")
        try:
            wait_for_socket(sock, proc=srv.proc)
            rc, rep = call(hookclient, sock, "-shutdown")
            assert rc == 0 and rep["shutdown"], rep
            assert srv.wait(timeout=10) == 0
            assert not sock.exists()
        finally:
            srv.stop()
    finally:
        shutil.rmtree(d, ignore_errors=True)
