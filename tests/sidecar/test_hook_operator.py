"""The operator's promises at the hook: versions and the reply size virt-launcher can
read. Real `pcitopo serve` processes on a socket, real gRPC clients."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import grpc
import pytest

from pcitopo import __version__
from pcitopo.serve.wire import MAX_MESSAGE_BYTES, MAX_REPLY_BYTES
from testkit.hookkit import VirtLauncher, fixture_domain, fixture_sysfs
from testkit.hookproto import info_pb2, info_pb2_grpc, v1alpha3_pb2, v1alpha3_pb2_grpc
from testkit.server_proc import BIN, ServerProcess, serve_argv, wait_for_socket


@pytest.fixture
def serve(tmp_path):
    d = Path(tempfile.mkdtemp(prefix="pcitopo-op-"))
    started: list[ServerProcess] = []

    def _serve(*extra: str) -> ServerProcess:
        srv = ServerProcess(serve_argv(d / "pcitopo.sock", fixture_sysfs("hgx-b200")) + list(extra), tmp_path / f"s{len(started)}.log")
        srv.socket = d / "pcitopo.sock"
        started.append(srv)
        wait_for_socket(srv.socket, proc=srv.proc)
        return srv

    yield _serve
    for srv in started:
        srv.stop()
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


def _info(sock: Path) -> info_pb2.InfoResult:
    with VirtLauncher.dial(str(sock)) as ch:
        return info_pb2_grpc.InfoStub(ch).Info(info_pb2.InfoParams(), timeout=1.0)


def test_versions_in_the_log_and_kubevirts_version_arg_is_accepted(serve):
    """`--version v1alpha2` (as KubeVirt's example sidecars pass it) no longer stops
    the server; the version is in the serving line and in the Info log."""
    srv = serve("--version", "v1alpha2")
    assert _info(srv.socket).name == "pcitopo"
    lines = srv.log_lines()
    serving = next(r for r in lines if r.get("event") == "serving")
    assert serving["pcitopo_version"] == __version__
    ignored = next(r for r in lines if r.get("event") == "args")
    assert ignored["ignored"] == "--version v1alpha2" and ignored["level"] == "warning"
    info = next(r for r in lines if r.get("event") == "Info")
    assert info["pcitopo_version"] == __version__ and info["name"] == "pcitopo"


def test_version_flags_and_a_wrong_serve_argument_named_once():
    """--version on every command; a bad serve argument is one line with the prefix
    once (it was `pcitopo serve: pcitopo serve: ...`)."""
    for argv in (["pcitopo", "--version"], ["xmlfix", "--version"], ["pcitopo", "serve", "--version"]):
        r = subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, timeout=60)
        assert r.returncode == 0 and __version__.encode() in r.stdout, (argv, r)
    r = subprocess.run([str(BIN / "pcitopo"), "serve", "--version", "v2"], capture_output=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count(b"pcitopo serve:") == 1 and b"not a hook API version" in r.stderr
    r = subprocess.run([str(BIN / "pcitopo"), "serve", "--bogus"], capture_output=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count(b"pcitopo serve:") == 1


def test_a_reply_virt_launcher_cannot_read_is_refused_by_name(serve):
    """A domain under the 8 MiB request limit whose rewrite exceeds grpc-go's 4 MiB
    client limit gets a pcitopo error, not a reply the client cannot read."""
    assert MAX_REPLY_BYTES < MAX_MESSAGE_BYTES
    srv = serve()
    dom = fixture_domain("hgx-b200")
    pad = b"<description>" + b"x" * (MAX_REPLY_BYTES - len(dom)) + b"</description>"
    big = dom.replace(b"<devices>", pad + b"<devices>", 1)
    assert MAX_REPLY_BYTES < len(big) < MAX_MESSAGE_BYTES
    opts = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]  # so only the server can refuse
    with grpc.insecure_channel(f"unix://{srv.socket}", options=opts) as ch:
        with pytest.raises(grpc.RpcError) as ei:
            v1alpha3_pb2_grpc.CallbacksStub(ch).OnDefineDomain(v1alpha3_pb2.OnDefineDomainParams(domainXML=big), timeout=60)
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ei.value.details().startswith("pcitopo: domain:") and str(MAX_REPLY_BYTES) in ei.value.details()
    assert _info(srv.socket).name == "pcitopo"  # still serving
