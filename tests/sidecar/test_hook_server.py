"""`pcitopo serve` as a process: the socket's life, Info, errors, permissions, logs, signals."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import pytest

from pcitopo.libvirt.lenient import with_hostdev_modes
from pcitopo.serve.options import PREFIX
from pcitopo.serve.server import COMPUTE_GID, COMPUTE_UID, SOCKET_MODE
from pcitopo.serve.wire import MAX_MESSAGE_BYTES
from testkit.hookkit import (
    REPO,
    VirtLauncher,
    fixture_domain,
    fixture_sysfs,
    vmi_json,
)
from testkit.hookproto import (
    info_pb2,
    info_pb2_grpc,
    v1alpha1_pb2,
    v1alpha1_pb2_grpc,
    v1alpha2_pb2,
    v1alpha2_pb2_grpc,
    v1alpha3_pb2,
    v1alpha3_pb2_grpc,
)
from testkit.server_proc import BIN, ServerProcess, serve_argv, wait_for_socket

ROOT = os.geteuid() == 0


@pytest.fixture
def hooks_dir():
    """A hooks folder like KubeVirt's emptyDir (0777), reachable by uid 107 for the tests that
    connect as that user (pytest's own tmp folders are 0700)."""
    d = Path(tempfile.mkdtemp(prefix="pcitopo-hooks-"))
    os.chmod(d, 0o755)
    (d / "hook-sidecar-0").mkdir()
    os.chmod(d / "hook-sidecar-0", 0o777)
    yield d
    for p in sorted(d.rglob("*"), reverse=True):
        (p.rmdir() if p.is_dir() and not p.is_symlink() else p.unlink())
    d.rmdir()


@pytest.fixture
def start(hooks_dir, tmp_path):
    """Start `pcitopo serve` on hook-sidecar-0/pcitopo.sock; every server is stopped by PID."""
    started: list[ServerProcess] = []

    def _start(sysfs: str = fixture_sysfs("hgx-b200"), extra: list[str] | None = None, wait: bool = True) -> ServerProcess:
        sock = hooks_dir / "hook-sidecar-0" / "pcitopo.sock"
        srv = ServerProcess(serve_argv(sock, sysfs) + (extra or []), tmp_path / f"server-{len(started)}.log")
        srv.socket = sock
        started.append(srv)
        if wait:
            wait_for_socket(sock, proc=srv.proc)
        return srv

    yield _start
    for srv in started:
        srv.stop()


def channel(path) -> grpc.Channel:
    return VirtLauncher.dial(str(path))


def info(path) -> info_pb2.InfoResult:
    with channel(path) as ch:
        return info_pb2_grpc.InfoStub(ch).Info(info_pb2.InfoParams(), timeout=1.0)


def define(path, domain: bytes, vmi: bytes = b"", version=(v1alpha3_pb2, v1alpha3_pb2_grpc)) -> bytes:
    pb2, pb2_grpc = version
    with channel(path) as ch:
        return pb2_grpc.CallbacksStub(ch).OnDefineDomain(pb2.OnDefineDomainParams(domainXML=domain, vmi=vmi), timeout=60).domainXML


def test_info_lists_the_three_versions_and_our_hook_points(start):
    srv = start()
    res = info(srv.socket)
    assert list(res.versions) == ["v1alpha3", "v1alpha2", "v1alpha1"]
    assert [(h.name, h.priority) for h in res.hookPoints] == [("OnDefineDomain", 0), ("Shutdown", 0)]
    assert res.name == "pcitopo"


def test_the_server_process_keeps_openssl_out_and_validates_options(start):
    """src/pcitopo/serve/process.py: `pcitopo serve` never maps OpenSSL, although pydantic (imported with
    the server) and grpcio would load it if they could; and it still validates options."""
    srv = start()
    vmi = vmi_json(DOMAIN, {f"{PREFIX}on-error": "passthrough"})
    assert define(srv.socket, DOMAIN, vmi)
    maps = Path(f"/proc/{srv.proc.pid}/maps").read_text()
    assert "pydantic_core" in maps, "the server did not load pydantic: is this the server process?"
    assert not [line for line in maps.splitlines() if "libssl" in line or "libcrypto" in line]


def test_the_folder_holds_our_socket_and_nothing_else(start):
    srv = start()
    info(srv.socket)
    assert os.listdir(srv.socket.parent) == ["pcitopo.sock"]


def test_socket_permissions_let_the_compute_container_in_and_nobody_else(start):
    srv = start()
    # The socket listens (with its mode) before the server hands it to uid 107; "serving" is
    # logged after the chown, so ownership is judged from then on.
    deadline = time.monotonic() + 30
    while not any(r.get("event") == "serving" for r in srv.log_lines()):
        assert time.monotonic() < deadline, srv.log_text()[-2000:]
        time.sleep(0.01)
    st = os.lstat(srv.socket)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == SOCKET_MODE == 0o660
    if ROOT:
        assert (st.st_uid, st.st_gid) == (COMPUTE_UID, COMPUTE_GID) == (107, 107)
    else:
        assert st.st_uid == os.geteuid()


# Runs as root long enough to load Python (the interpreter lives under /root here), then
# becomes the given uid/gid for good before touching the socket.
INFO_AS_CLIENT = r"""
import sys, time, os, grpc
from testkit.hookproto import info_pb2, info_pb2_grpc
path, uid = sys.argv[1], int(sys.argv[2])
if uid >= 0:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
deadline = time.monotonic() + 20
while not os.path.exists(path):
    if time.monotonic() > deadline: sys.exit("no socket")
    time.sleep(0.001)
ch = grpc.insecure_channel("unix:" + path)
try:
    grpc.channel_ready_future(ch).result(timeout=2)
    r = info_pb2_grpc.InfoStub(ch).Info(info_pb2.InfoParams(), timeout=1.0)
    print("OK", list(r.versions))
except grpc.FutureTimeoutError:
    print("DIAL-FAILED")
except grpc.RpcError as e:
    print("INFO-FAILED", e.code())
"""


def run_client_as(uid: int | None, path: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-c", INFO_AS_CLIENT, str(path), str(-1 if uid is None else uid)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd="/", text=True)


@pytest.mark.skipif(not ROOT, reason="needs root to act as uid 107 and as nobody")
def test_uid_107_can_call_and_nobody_cannot(start):
    srv = start()
    ok = run_client_as(107, srv.socket)
    out, err = ok.communicate(timeout=30)
    assert out.startswith("OK"), (out, err)
    nobody = run_client_as(65534, srv.socket)
    out, err = nobody.communicate(timeout=30)
    assert out.startswith("DIAL-FAILED"), (out, err)
    with socket.socket(socket.AF_UNIX) as s:  # and the reason is the file mode, nothing else
        os.setegid(65534)
        os.seteuid(65534)
        try:
            with pytest.raises(PermissionError):
                s.connect(str(srv.socket))
        finally:
            os.seteuid(0)
            os.setegid(0)


@pytest.mark.parametrize("uid", [107, None] if ROOT else [None])
def test_info_answers_the_instant_the_socket_appears(start, uid, hooks_dir):
    """virt-launcher panics on an Info error: a client that dials the moment the socket shows
    up must always get its answer within the 1 s deadline."""
    for _ in range(5):
        client = run_client_as(uid, hooks_dir / "hook-sidecar-0" / "pcitopo.sock")
        time.sleep(0.05)
        srv = start(wait=False)
        out, err = client.communicate(timeout=30)
        assert out.startswith("OK ['v1alpha3', 'v1alpha2', 'v1alpha1']"), (out, err)
        srv.stop()
        assert not srv.socket.exists()


def test_a_stale_socket_is_replaced(start, hooks_dir):
    sock = hooks_dir / "hook-sidecar-0" / "pcitopo.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))  # bound, never listening, then abandoned: what a killed server leaves
    s.close()
    assert sock.exists()
    srv = start()
    assert info(srv.socket).name == "pcitopo"
    serving = next(r for r in srv.log_lines() if r.get("event") == "serving")
    assert serving["replaced_stale_socket"] is True


def test_the_serving_line_names_the_kubevirt_releases_it_relies_on(start):
    """One line at start says what the output relies on: the raw define, the
    re-parse per release, no domain-hook plugins (docs/DEPLOY.md, "KubeVirt releases")."""
    srv = start()
    info(srv.socket)
    serving = [ln for ln in srv.log_path.read_text().splitlines() if '"event":"serving"' in ln.replace(" ", "")]
    assert len(serving) == 1
    relies = json.loads(serving[0])["relies_on"]
    for needle in ("v1.6", "main", "as sent", "busNr", "Plugins", "maxphysaddr", "qemu:override"):
        assert needle in relies, needle


def test_a_live_socket_is_left_alone(start, hooks_dir):
    sock = hooks_dir / "hook-sidecar-0" / "pcitopo.sock"
    live = socket.socket(socket.AF_UNIX)
    live.bind(str(sock))
    live.listen(1)
    try:
        srv = start(wait=False)
        assert srv.wait(30) == 2
        lines = srv.log_path.read_text().strip().splitlines()
        assert lines[-1] == f"pcitopo serve: {sock}: another server is listening on this socket; refusing to replace it"
        assert sock.exists()
    finally:
        live.close()


def test_something_else_in_the_way_is_not_removed(start, hooks_dir):
    sock = hooks_dir / "hook-sidecar-0" / "pcitopo.sock"
    sock.write_text("not a socket")
    srv = start(wait=False)
    assert srv.wait(30) == 2
    assert srv.log_path.read_text().strip().splitlines()[-1].endswith("exists and is not a socket; refusing to replace it")
    assert sock.read_text() == "not a socket"


def test_a_missing_folder_or_bad_flag_is_one_line_and_exit_2(tmp_path):
    for argv, needle in [
        (["--socket", str(tmp_path / "nope" / "pcitopo.sock")], "does not exist"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ]:
        r = subprocess.run([str(BIN / "pcitopo"), "serve", *argv], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r
        lines = [line for line in r.stderr.splitlines() if not line.startswith("{")]
        assert len(lines) == 1 and lines[0].startswith("pcitopo serve: ") and needle in lines[0], r.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_gracefully_and_removes_the_socket(start, sig):
    srv = start()
    info(srv.socket)
    os.kill(srv.pid, sig)
    assert srv.wait(15) == 0
    assert not srv.socket.exists() and os.listdir(srv.socket.parent) == []
    assert srv.log_lines()[-1]["event"] == "stopped" and srv.log_lines()[-1]["reason"] == sig.name


def test_shutdown_stops_the_server_and_removes_the_socket(start):
    srv = start()
    with channel(srv.socket) as ch:
        v1alpha3_pb2_grpc.CallbacksStub(ch).Shutdown(v1alpha3_pb2.ShutdownParams(), timeout=10)
    assert srv.wait(15) == 0
    assert not srv.socket.exists()
    events = [r.get("event") for r in srv.log_lines()]
    assert events[-2:] == ["Shutdown", "stopped"]


def test_pre_cloud_init_iso_hands_back_its_input(start):
    srv = start()
    for pb2, pb2_grpc in ((v1alpha2_pb2, v1alpha2_pb2_grpc), (v1alpha3_pb2, v1alpha3_pb2_grpc)):
        with channel(srv.socket) as ch:
            res = pb2_grpc.CallbacksStub(ch).PreCloudInitIso(
                pb2.PreCloudInitIsoParams(cloudInitNoCloudSource=b'{"userData":"x"}', vmi=b"{}", cloudInitData=b'{"dataSource":"NoCloud"}'),
                timeout=10,
            )
        assert (res.cloudInitNoCloudSource, res.cloudInitData) == (b'{"userData":"x"}', b'{"dataSource":"NoCloud"}')


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    """One server for the error-path tests: each must leave it serving for the next."""
    d = tmp_path_factory.mktemp("hooks") / "hook-sidecar-0"
    d.mkdir()
    srv = ServerProcess(serve_argv(d / "pcitopo.sock", fixture_sysfs("hgx-b200")), d.parent / "server.log")
    srv.socket = d / "pcitopo.sock"
    wait_for_socket(srv.socket, proc=srv.proc)
    yield srv
    srv.stop()


DOMAIN = fixture_domain("hgx-b200")


@pytest.mark.parametrize(
    "domain,vmi,code,prefix,needle",
    [
        (b"<domain><devices>", b"", grpc.StatusCode.INVALID_ARGUMENT, "pcitopo: domain: ", "malformed domain XML"),
        (b"", b"", grpc.StatusCode.INVALID_ARGUMENT, "pcitopo: domain: ", "empty"),
        (DOMAIN.replace(b'bus="0x1b" slot="0x00"', b'bus="0x77" slot="0x00"', 1), b"", grpc.StatusCode.INVALID_ARGUMENT,
         "pcitopo: domain: ", "0000:77:00.0 is not a PCI function on this host"),
        (DOMAIN.replace(b"q35", b"i440fx"), b"", grpc.StatusCode.INVALID_ARGUMENT, "pcitopo: domain: ", "not q35"),
        (DOMAIN, vmi_json(DOMAIN, {f"{PREFIX}mode": "mirorr"}), grpc.StatusCode.INVALID_ARGUMENT, "pcitopo: config: ",
         "annotation pcitopo.kubevirt.io/mode is 'mirorr'; allowed values: mirror | off"),
        (DOMAIN, b"{not json", grpc.StatusCode.INVALID_ARGUMENT, "pcitopo: vmi: ", "VMI JSON is malformed"),
        (b'<!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]><domain>&x;</domain>', b"", grpc.StatusCode.INVALID_ARGUMENT,
         "pcitopo: domain: ", ""),
    ],
    ids=["malformed", "empty", "unknown-bdf", "not-q35", "bad-annotation", "bad-vmi-json", "xxe"],
)
def test_bad_input_is_a_one_line_grpc_error_and_the_server_keeps_serving(shared_server, domain, vmi, code, prefix, needle):
    with pytest.raises(grpc.RpcError) as ei:
        define(shared_server.socket, domain, vmi)
    assert ei.value.code() == code
    details = ei.value.details()
    assert details.startswith(prefix) and needle in details and "\n" not in details, details
    assert "/etc/passwd" not in details or "root:" not in details
    assert info(shared_server.socket).name == "pcitopo"
    last = [r for r in shared_server.log_lines() if r.get("event") == "OnDefineDomain"][-1]
    assert last["outcome"] == "failed" and last["level"] == "error" and details.endswith(last["reason"])


def test_an_oversized_request_is_refused_by_grpc_and_the_server_keeps_serving(shared_server):
    with pytest.raises(grpc.RpcError) as ei:
        define(shared_server.socket, b"<domain>" + b" " * MAX_MESSAGE_BYTES + b"</domain>")
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info(shared_server.socket).name == "pcitopo"


@pytest.mark.parametrize("method", ["v1alpha3.Callbacks/OnDefineDomain", "v1alpha2.Callbacks/PreCloudInitIso",
                                    "v1alpha3.Callbacks/Shutdown"])
def test_a_request_that_is_not_protobuf_is_refused_and_the_server_keeps_serving(shared_server, method):
    """The server decodes requests itself (src/pcitopo/serve/wire.py): bytes protobuf would refuse end the
    call with INVALID_ARGUMENT and one line, and nothing else happens (Shutdown does not stop)."""
    with grpc.insecure_channel(f"unix:{shared_server.socket}") as ch:
        call = ch.unary_unary(f"/kubevirt.hooks.{method}")
        with pytest.raises(grpc.RpcError) as ei:
            call(b"\x0a\x05abc", timeout=10)  # field 1, length 5, only 3 bytes follow
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ei.value.details() == "pcitopo: request: not a protobuf message (truncated field)"
    assert info(shared_server.socket).name == "pcitopo"


def test_passthrough_and_off_return_the_input_with_only_the_hostdev_mode_added(shared_server):
    bad = DOMAIN.replace(b'bus="0x1b" slot="0x00"', b'bus="0x77" slot="0x00"', 1)
    assert define(shared_server.socket, bad, vmi_json(bad, {f"{PREFIX}on-error": "passthrough"})) == with_hostdev_modes(bad)[0]
    last = [r for r in shared_server.log_lines() if r.get("event") == "OnDefineDomain"][-1]
    assert last["outcome"] == "passthrough" and last["level"] == "warning" and "0000:77:00.0" in last["reason"]
    assert define(shared_server.socket, DOMAIN, vmi_json(DOMAIN, {f"{PREFIX}mode": "off"})) == with_hostdev_modes(DOMAIN)[0]


def test_every_log_line_is_json_and_a_call_says_what_happened(shared_server):
    out = define(shared_server.socket, DOMAIN, vmi_json(DOMAIN, name="train-7", namespace="team-a"))
    assert out != DOMAIN and out.count(b"pcie-expander-bus") >= 1
    lines = shared_server.log_path.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line parses
    assert all({"ts", "level", "event"} <= set(r) for r in records)
    rec = [r for r in records if r["event"] == "OnDefineDomain"][-1]
    assert rec["vmi"] == "team-a/train-7" and rec["outcome"] == "rewritten" and rec["version"] == "v1alpha3"
    assert isinstance(rec["call"], int) and rec["call"] >= 1 and rec["duration_ms"] > 0
    for key in ("devices_placed", "pxbs", "switches", "pairs", "pairs_nccl_equal", "pairs_nvml_equal", "fidelity_lost", "numa"):
        assert key in rec, key
    assert rec["devices_placed"] == DOMAIN.count(b"<hostdev ") and rec["fidelity_lost"] == 0
    calls = [r["call"] for r in records if r["event"] == "OnDefineDomain"]
    assert calls == sorted(calls) and len(set(calls)) == len(calls)


def test_every_version_serves_on_define_domain_alike(shared_server):
    outs = {define(shared_server.socket, DOMAIN, b"", version=v) for v in
            ((v1alpha1_pb2, v1alpha1_pb2_grpc), (v1alpha2_pb2, v1alpha2_pb2_grpc), (v1alpha3_pb2, v1alpha3_pb2_grpc))}
    assert len(outs) == 1 and outs != {DOMAIN}


def test_an_unreadable_sysfs_still_serves_and_says_why_per_call(start):
    srv = start(sysfs="/nonexistent/sysfs")
    assert info(srv.socket).name == "pcitopo"
    with pytest.raises(grpc.RpcError) as ei:
        define(srv.socket, DOMAIN)
    assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert ei.value.details().startswith("pcitopo: sysfs: /nonexistent/sysfs")
    assert define(srv.socket, DOMAIN, vmi_json(DOMAIN, {f"{PREFIX}mode": "off"})) == with_hostdev_modes(DOMAIN)[0]
    host = next(r for r in srv.log_lines() if r.get("event") == "host")
    assert host["level"] == "error" and host["error"] == "sysfs"
