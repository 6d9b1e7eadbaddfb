"""The hostile corpus (tests/hostile/cases.toml) through both entry points (xmlfix and the socket), and the security claims
of docs/SECURITY.md that a test can check.

- ``xmlfix`` as a subprocess: exit 2 and exactly one line on stderr naming the cause (the
  manifest's regex), never a traceback; or, for inputs that are fine, exit 0 and an output
  that passes the case's checks.
- ``pcitopo serve`` as a subprocess, over its Unix socket: a gRPC error whose details are
  ``pcitopo: <kind>: <the same line>``; under ``on-error: passthrough`` the input back byte
  for byte (except bad options, which stay fatal); and after every hostile call the server
  still answers Info and a good OnDefineDomain correctly.

Processes are stopped by their own PID. Sockets live in short /tmp folders (AF_UNIX paths are
limited to 108 bytes).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from lxml import etree

from pcitopo.errors import PcitopoError
from pcitopo.guest.rewrite import rewrite_domain
from pcitopo.host.sysfs import open_host
from pcitopo.libvirt.lenient import with_hostdev_modes
from pcitopo.serve.options import PREFIX
from pcitopo.synth import load_topo_file
from testkit.kubevirt_sim import DomainSpec, gpus_and_nics, kubevirt_domain
from testkit.server_proc import PrivateServer

HERE = Path(__file__).resolve().parent
HOSTILE = HERE / "hostile"
REPO = HERE.parent
BIN = Path(sys.executable).parent
SCHEMA = "/usr/share/libvirt/schemas/domain.rng"
OVERSIZED_BYTES = 50 * 1024 * 1024
PASSTHROUGH_VMI = json.dumps({"metadata": {"name": "gpu-vm", "namespace": "ml",
                                           "annotations": {f"{PREFIX}on-error": "passthrough"}}}).encode()
# The longest error line we accept: readable, and well inside gRPC's metadata limits (8 KiB
# soft, 16 KiB hard on the client side) for the status details that carry it.
MAX_LINE = 4096
# Damaged sysfs copies go to a tmpfs when there is one (thousands of tiny files).
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
# Generous bounds so a blocked read or a hung server fails the test instead of hanging CI.
SUBPROCESS_TIMEOUT_S = 60


def load_cases() -> list[dict]:
    with open(HOSTILE / "cases.toml", "rb") as fh:
        cases = tomllib.load(fh)["case"]
    names = [c["name"] for c in cases]
    assert len(names) == len(set(names)), "duplicate case names in cases.toml"
    return cases


CASES = load_cases()


def params(cases: list[dict]):
    out = []
    for c in cases:
        marks = [pytest.mark.xfail(strict=True, reason=c["xfail"])] if "xfail" in c else []
        out.append(pytest.param(c, id=c["name"], marks=marks))
    return out


# -- materialising a case ----------------------------------------------------------------------

@dataclass
class Host:
    sysfs: str
    held_fds: list[int] = field(default_factory=list)
    tmp: Path | None = None

    def close(self) -> None:
        for fd in self.held_fds:
            os.close(fd)
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _dev_dir(root: Path, bdf: str) -> Path:
    link = root / "bus/pci/devices" / bdf
    return Path(os.path.normpath(link.parent / os.readlink(link)))


def _mutate(root: Path, path: str, make: str, held: list[int]) -> None:
    m = re.match(r"^\{dev:([^}]+)\}(.*)$", path)
    target = (_dev_dir(root, m.group(1)) / m.group(2).lstrip("/")) if m else root / path
    if make == "no-root-complex":
        # The device link points at a copy of the function's directory right below devices/,
        # with no pciDDDD:BB root complex above it.
        real = root / "devices" / target.name
        shutil.copytree(_dev_dir(root, target.name), real, symlinks=True)
        target.unlink()
        os.symlink(os.path.relpath(real, target.parent), target)
        return
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.is_dir() and make != "loop":
        shutil.rmtree(target)
    if make == "missing":
        return
    if make in ("fifo", "fifo-with-writer"):
        os.mkfifo(target)
        if make == "fifo-with-writer":
            # A writer that never writes: a blocking read would hang forever.
            held.append(os.open(target, os.O_RDWR | os.O_NONBLOCK))
    elif make == "dir":
        target.mkdir()
    elif make == "abs-passwd":
        os.symlink("/etc/passwd", target)
    elif make == "huge":
        target.write_bytes(b"0x10de\n" * (1 << 17))
    elif make == "garbage":
        target.write_bytes(b"\xff\xfe\x00 not a number \x1b[31m\n")
    elif make == "file":
        target.write_text("not a directory\n")
    elif make == "loop":
        # The entry becomes a symlink to itself (a directory: everything below it vanishes).
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.symlink(target.name, target)
    else:  # pragma: no cover
        raise AssertionError(f"unknown mutation {make!r}")


def _capture(kind: str, out: Path) -> None:
    if kind == "not-gzip":
        out.write_text("this is not a tarball\n")
        return
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        if kind == "traversal":
            data = b"0x10de\n"
            info = tarfile.TarInfo("../../../../../tmp/pcitopo-hostile-escaped")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        elif kind == "huge-member":
            data = b"0" * 100_000
            info = tarfile.TarInfo("devices/pci0000:15/0000:15:01.0/vendor")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out.write_bytes(raw.getvalue())


def materialize_host(case: dict) -> Host:
    kind, _, arg = case["host"].partition(":")
    if kind == "fixture":
        return Host(str(REPO / "fixtures" / arg))
    if kind == "path":
        return Host(arg)
    tmp = Path(tempfile.mkdtemp(prefix="pcitopo-hostile-", dir=SCRATCH))
    host = Host(str(tmp / "sysfs"), tmp=tmp)
    try:
        return _build_host(case, kind, arg, tmp, host)
    except BaseException:
        host.close()
        raise


def _build_host(case: dict, kind: str, arg: str, tmp: Path, host: Host) -> Host:
    if kind == "capture":
        host.sysfs = str(tmp / "capture.tar.gz")
        _capture(arg, Path(host.sysfs))
        return host
    assert kind == "topo", case["host"]
    tree = load_topo_file(HOSTILE / arg)
    if not case.get("mutate"):
        # Undamaged: a capture tarball (one file, read into memory) is as good and much faster
        # to write than thousands of small files.
        host.sysfs = str(tmp / "sysfs.tar.gz")
        tree.write_tarball(host.sysfs)
        return host
    tree.write_dir(tmp / "sysfs")
    for m in case.get("mutate", []):
        _mutate(tmp / "sysfs", m["path"], m["make"], host.held_fds)
    return host


def materialize_domain(case: dict) -> bytes:
    spec = case["domain"]
    if spec == "generate:oversized":
        base = (HOSTILE / "domains/base.xml").read_bytes()
        pad = b"<description>" + b"x" * OVERSIZED_BYTES + b"</description>"
        return base.replace(b"</name>", b"</name>" + pad, 1)
    if spec == "generate:long-alias":
        return (HOSTILE / "domains/unknown-bdf.xml").read_bytes().replace(b"ua-gpu-gpu0", b"ua-" + b"A" * 100_000, 1)
    if spec == "generate:all-devices":
        kind, _, arg = case["host"].partition(":")
        topo = open_host_for(case)
        return kubevirt_domain(topo, DomainSpec("all", tuple(gpus_and_nics(topo))))
    return (HOSTILE / spec).read_bytes()


def open_host_for(case: dict):
    kind, _, arg = case["host"].partition(":")
    if kind == "topo":
        from pcitopo.host.sysfs import SysfsReader
        from pcitopo.model.tree import Topology

        return Topology(SysfsReader(load_topo_file(HOSTILE / arg)))
    return open_host(REPO / "fixtures" / arg)


# -- xmlfix ------------------------------------------------------------------------------------

def run_xmlfix(domain: bytes, sysfs: str, vmi: Path | None, workdir: Path) -> subprocess.CompletedProcess:
    dom = workdir / "domain.xml"
    dom.write_bytes(domain)
    argv = [str(BIN / "xmlfix"), "--sysfs", sysfs]
    if vmi is not None:
        argv += ["--vmi", str(vmi)]
    argv.append(str(dom))
    env = {k: v for k, v in os.environ.items() if k != "PCITOPO_DEBUG"}
    return subprocess.run(argv, capture_output=True, timeout=SUBPROCESS_TIMEOUT_S, env=env, cwd=workdir)


def check_accepted(case: dict, domain: bytes, out: bytes) -> None:
    assert out.strip(), "accepted, but no XML came back"
    doc = etree.fromstring(out)
    for check in case.get("check", []):
        if check == "no-passwd":
            assert b"root:x:0:0" not in out and b"/bin/bash" not in out, "local file content leaked into the output"
        elif check == "no-node":
            assert doc.find("devices/controller/target/node") is None, "a <node> appeared for a host without NUMA"
        elif check == "unchanged":
            # as sent, but with libvirt's default hostdev mode written where it was missing
            assert out == with_hostdev_modes(domain)[0], "the input did not come back as sent"
        elif check == "schema":
            if os.path.exists(SCHEMA):
                rng = etree.RelaxNG(file=SCHEMA)
                assert rng.validate(doc), rng.error_log.last_error
        else:  # pragma: no cover
            raise AssertionError(f"unknown check {check!r}")


@dataclass(frozen=True)
class XmlfixRun:
    returncode: int
    stdout: bytes
    stderr: str
    sysfs: str  # the (temporary) sysfs path it ran on, as error lines may name it


def _run_case_xmlfix(case: dict) -> XmlfixRun:
    host = materialize_host(case)
    work = Path(tempfile.mkdtemp(prefix="pcitopo-xmlfix-"))
    try:
        domain = materialize_domain(case)
        vmi = HOSTILE / case["vmi"] if "vmi" in case else None
        res = run_xmlfix(domain, host.sysfs, vmi, work)
    finally:
        host.close()
        shutil.rmtree(work, ignore_errors=True)
    return XmlfixRun(res.returncode, res.stdout, res.stderr.decode("utf-8", "replace"), host.sysfs)


@pytest.fixture(scope="module")
def xmlfix_runs(request) -> dict[str, XmlfixRun]:
    """xmlfix on every selected case, a few subprocesses at a time (each is mostly start-up)."""
    selected = {}
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.module is request.module and callspec is not None and "case" in callspec.params:
            c = callspec.params["case"]
            selected[c["name"]] = c
    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(selected, pool.map(_run_case_xmlfix, selected.values())))


@pytest.mark.parametrize("case", params(CASES))
def test_xmlfix(case, xmlfix_runs):
    res = xmlfix_runs[case["name"]]
    err = res.stderr
    assert "Traceback" not in err, err
    assert res.returncode == case["exit"], f"exit {res.returncode}, stderr: {err!r}"
    if case["exit"] == 2:
        lines = err.splitlines()
        assert len(lines) == 1, f"want exactly one line on stderr, got {[ln[:200] for ln in lines]!r}"
        assert len(lines[0]) <= MAX_LINE, f"a {len(lines[0])}-character line: {lines[0][:200]}..."
        assert lines[0].startswith("xmlfix: "), lines[0]
        assert re.search(case["stderr"], lines[0]), f"{lines[0]!r} does not name the cause /{case['stderr']}/"
        assert res.stdout == b"", "bad input, yet something was written to stdout"
    else:
        # A passthrough or off outcome is named on stderr, one line; an
        # accepted rewrite prints nothing there but the warnings the case expects (what the hook
        # would log and boot anyway: failed readiness checks, firmware, NVLink).
        left = "unchanged" in case.get("check", []) or "off" in case["name"]
        if left:
            assert err.startswith("xmlfix: domain left unchanged (") and err.count("\n") == 1, err
        else:
            want = case.get("warnings", [])
            lines = err.splitlines()
            assert len(lines) == len(want), err
            assert all(re.search(w, line) for w, line in zip(want, lines)), err
        check_accepted(case, materialize_domain(case), res.stdout)


# -- the socket ------------------------------------------------------------------------------------

def start_server(sysfs: str) -> PrivateServer:
    """``pcitopo serve`` on a short socket path (without PCITOPO_DEBUG), answering Info."""
    env = {k: v for k, v in os.environ.items() if k != "PCITOPO_DEBUG"}
    srv = PrivateServer(sysfs, env=env, prefix="pcitopo-h-")
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT_S
    while True:
        assert srv.proc.poll() is None, f"server exited with {srv.proc.returncode}: {srv.log_text()}"
        if srv.socket.exists():
            try:
                srv.info()
                break
            except grpc.RpcError:
                pass
        if time.monotonic() > deadline:
            srv.stop()
            raise AssertionError("server did not come up")
        time.sleep(0.05)
    return srv


@pytest.fixture(scope="module")
def fixture_server():
    """One server on the hgx-h100 fixture for every case that uses it (it must survive them all)."""
    srv = start_server(str(REPO / "fixtures" / "hgx-h100"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def good_call():
    domain = (HOSTILE / "domains/base.xml").read_bytes()
    expected = rewrite_domain(domain, open_host(REPO / "fixtures" / "hgx-h100")).xml
    return domain, expected


@pytest.mark.parametrize("case", params(CASES))
def test_socket(case, fixture_server, good_call, xmlfix_runs):
    shared = case["host"] == "fixture:hgx-h100"
    host = materialize_host(case)
    srv = fixture_server if shared else start_server(host.sysfs)
    try:
        domain = materialize_domain(case)
        vmi_path = HOSTILE / case["vmi"] if "vmi" in case else None
        vmi = vmi_path.read_bytes() if vmi_path else b""
        run = xmlfix_runs[case["name"]]
        line, stdout = run.stderr.strip(), run.stdout
        try:
            out = srv.define(domain, vmi)
            status, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            out, status, details = None, e.code(), e.details() or ""
        assert status.name == case["grpc"], f"gRPC {status.name} ({details!r}), want {case['grpc']}"
        if status == grpc.StatusCode.OK:
            assert out == stdout, "the socket and xmlfix answer the same input differently"
            check_accepted(case, domain, out)
        else:
            assert "\n" not in details and "Traceback" not in details, details[:500]
            assert len(details) <= MAX_LINE + len("pcitopo: internal: "), f"{len(details)} characters: {details[:200]}"
            if "grpc_details" in case:
                assert re.search(case["grpc_details"], details), details
            else:
                assert line.startswith("xmlfix: "), line
                # Both runs name their own temporary sysfs copy.
                assert re.search(case["stderr"], details), details
                line = line.replace(run.sysfs, "<sysfs>")
                details = details.replace(host.sysfs, "<sysfs>")
                assert details == f"pcitopo: {_kind(details)}: {line[len('xmlfix: '):]}", (details, line)
        # on-error: passthrough
        mode = case.get("passthrough")
        if mode is not None and "vmi" not in case:
            try:
                back = srv.define(domain, PASSTHROUGH_VMI)
                assert mode == "unchanged", f"passthrough answered, but the case says {mode}"
                assert back == with_hostdev_modes(domain)[0], "passthrough changed more than the hostdev mode"
            except grpc.RpcError as e:
                assert mode in ("error", "grpc"), f"passthrough still failed: {e.code().name} {e.details()}"
        # ... and the server keeps serving.
        assert srv.proc.poll() is None, f"the server died: {srv.log_text()[-2000:]}"
        assert "OnDefineDomain" in [h.name for h in srv.info().hookPoints]
        if shared:
            assert srv.define(*good_call[:1]) == good_call[1]
    finally:
        if not shared:
            srv.stop()
        host.close()


def _kind(details: str) -> str:
    return details.split(": ", 2)[1] if details.count(": ") >= 2 else ""


def test_every_corpus_file_has_a_case():
    """No file in tests/hostile/ lies around untested."""
    used = {c["domain"] for c in CASES} | {c.get("vmi") for c in CASES} | {c["host"].split(":", 1)[1] for c in CASES}
    files = {str(p.relative_to(HOSTILE)) for p in HOSTILE.rglob("*") if p.is_file() and p.name != "cases.toml"}
    unused = sorted(f for f in files if f not in used and f != "domains/base.xml")
    assert not unused, f"corpus files without a case in cases.toml: {unused}"


# The refused inputs of the corpus that a server on the fixture host answers quickly.
LOGGED_FAILURES = [c for c in CASES if c["host"] == "fixture:hgx-h100" and c["grpc"] != "OK"
                   and "xfail" not in c and not c["domain"].startswith("generate:")]


def test_the_server_logs_every_call_as_one_json_line_naming_the_cause(good_call):
    """A server of its own, the corpus's refused inputs, then a good call: every log line is
    one JSON object; every call is one OnDefineDomain record, numbered in order; a refused one
    says ``failed`` with the same kind and reason as the gRPC status details the caller got."""
    assert len(LOGGED_FAILURES) >= 20, "the corpus lost its refused inputs"
    srv = start_server(str(REPO / "fixtures" / "hgx-h100"))
    try:
        details = []
        for case in LOGGED_FAILURES:
            vmi = (HOSTILE / case["vmi"]).read_bytes() if "vmi" in case else b""
            with pytest.raises(grpc.RpcError) as err:
                srv.define(materialize_domain(case), vmi)
            details.append(err.value.details())
        assert srv.define(good_call[0]) == good_call[1]
        srv.proc.terminate()  # SIGTERM by PID: the server logs why it stopped
        assert srv.wait(10) == 0
        log = srv.log_text()
    finally:
        srv.stop()
    records = [json.loads(line) for line in log.splitlines()]
    assert all(isinstance(r, dict) and r.get("event") and r.get("level") for r in records), records
    calls = [r for r in records if r["event"] == "OnDefineDomain"]
    assert [r["call"] for r in calls] == list(range(1, len(LOGGED_FAILURES) + 2))
    for case, record, got in zip(LOGGED_FAILURES, calls, details):
        assert (record["level"], record["outcome"]) == ("error", "failed"), (case["name"], record)
        assert f"pcitopo: {record['error']}: {record['reason']}" == got, case["name"]
    assert (calls[-1]["level"], calls[-1]["outcome"]) == ("info", "rewritten")
    assert records[-1]["event"] == "stopped"


# -- security claims (docs/SECURITY.md) --------------------------------------------------------

AUDIT_SCRIPT = r"""
import json, os, sys, threading
# Import everything first: module loading opens files of the Python installation, which is
# not what the claims are about.
import grpc
from pcitopo.serve import server as srv
from pcitopo.serve.hooks import JsonLog
from pcitopo.serve.core import handle_define_domain
from pcitopo.serve import wire  # the request bytes (-I: the test kit's stubs are not importable)
from pcitopo.host.sysfs import open_host
import pcitopo.guest.rewrite, pcitopo.guest.view, pcitopo.views.report, encodings.idna

events = []
WATCH = ("open", "os.listdir", "os.scandir", "os.remove", "os.unlink", "os.rename", "os.mkdir", "os.rmdir",
         "os.chmod", "os.chown", "os.symlink", "os.link", "os.truncate", "socket.bind", "socket.connect",
         "socket.__new__", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
         "os.forkpty", "ctypes.dlopen", "urllib.Request", "http.client.connect", "shutil.rmtree")
def hook(event, args):
    if event in WATCH:
        events.append([event] + [a if isinstance(a, (str, int, type(None))) else repr(a) for a in args])
sys.addaudithook(hook)

mode, sysfs, sock, domain_path, vmi = sys.argv[1:6]
domain = open(domain_path, "rb").read()
events.clear()
if mode == "library":
    handle_define_domain(domain, vmi.encode(), open_host(sysfs))
else:
    server = srv.HookServer(sock, sysfs, log=JsonLog(open(os.devnull, "w")))
    events.clear()
    server.start()
    with grpc.insecure_channel("unix:" + sock) as ch:
        ch.unary_unary("/kubevirt.hooks.info.Info/Info")(b"", timeout=10)
        params = wire.encode_fields([(wire.DOMAIN_XML, domain), (wire.VMI, vmi.encode())])
        out = ch.unary_unary("/kubevirt.hooks.v1alpha3.Callbacks/OnDefineDomain")(params, timeout=60)
        assert wire.decode_fields(out).get(wire.DOMAIN_XML)
    server.shutdown("test")
sys.stdout.write(json.dumps(events))
"""


def _audit(mode: str, tmp_path: Path) -> list[list]:
    """Run the library (or the server) on a sysfs directory under an audit hook and return the
    file, process and network events it raised."""
    sysfs = tmp_path / "sysfs"
    load_topo_file(HOSTILE / "hosts/small.topo").write_dir(sysfs)
    sock_dir = Path(tempfile.mkdtemp(prefix="pcitopo-a-"))
    try:
        domain = tmp_path / "domain.xml"
        domain.write_bytes((HOSTILE / "domains/base.xml").read_bytes())
        vmi = json.dumps({"metadata": {"name": "v", "annotations": {f"{PREFIX}mode": "mirror"}}})
        # -I: no cwd, no PYTHONPATH on sys.path, as in the image (lazy imports list sys.path
        # entries; those must be the installation's, which _OWN_CODE covers).
        res = subprocess.run([sys.executable, "-I", "-c", AUDIT_SCRIPT, mode, str(sysfs), str(sock_dir / "pcitopo.sock"),
                              str(domain), vmi], capture_output=True, timeout=SUBPROCESS_TIMEOUT_S, cwd=tmp_path)
        assert res.returncode == 0, res.stderr.decode()[-3000:]
        return json.loads(res.stdout), str(sysfs), str(sock_dir / "pcitopo.sock")
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


_RUNS_SOMETHING = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty"}


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# Its own code: lazy imports read the Python installation, the venv and the (editable) repo.
_OWN_CODE = tuple({sys.prefix, sys.base_prefix, str(REPO / "src")})


def _opened(events) -> list[tuple[str, str | None, int | None]]:
    """Files opened, except read-only opens of its own code."""
    out = []
    for e in events:
        if e[0] != "open":
            continue
        path, mode, flags = e[1], e[2], e[3] if len(e) > 3 else None
        if str(path).startswith(_OWN_CODE) and not (flags or 0) & _WRITE_FLAGS and not (mode or "r").strip("rb"):
            continue
        out.append((path, mode, flags))
    return out


def test_the_rewrite_reads_only_sysfs_and_runs_nothing(tmp_path):
    """SECURITY.md: a hook call reads the sysfs tree and nothing else, writes nothing, starts
    no process and opens no network connection."""
    events, sysfs, _ = _audit("library", tmp_path)
    opened = _opened(events)
    assert opened, "the audit hook saw no file opened at all (is the test wired up?)"
    # besides sysfs, exactly the cpuinfo file (the host CPU's address width)
    cpuinfo = os.environ.get("PCITOPO_CPUINFO") or "/proc/cpuinfo"
    outside = [o for o in opened if not str(o[0]).startswith(sysfs + "/") and str(o[0]) != cpuinfo]
    assert not outside, f"opened outside sysfs: {outside[:5]}"
    writes = [o for o in opened if (o[2] or 0) & _WRITE_FLAGS or (o[1] or "r").strip("rb")]
    assert not writes, f"opened for writing: {writes[:5]}"
    listed = [e for e in events if e[0] in ("os.listdir", "os.scandir")
              and not str(e[1]).startswith(sysfs) and not str(e[1]).startswith(_OWN_CODE)]
    assert not listed, listed
    bad = [e for e in events if e[0] in _RUNS_SOMETHING or e[0].startswith(("socket.", "http.", "urllib."))]
    assert not bad, bad


def test_the_server_writes_only_its_socket(tmp_path):
    """SECURITY.md: the server creates, chmods and removes its socket and nothing else; reads
    only sysfs; binds and connects only to its own Unix socket; starts no process."""
    events, sysfs, sock = _audit("server", tmp_path)
    opened = _opened(events)
    cpuinfo = os.environ.get("PCITOPO_CPUINFO") or "/proc/cpuinfo"  # the host's address width
    outside = [o for o in opened if not str(o[0]).startswith(sysfs + "/") and o[0] not in (os.devnull, cpuinfo)]
    assert not outside, f"opened outside sysfs: {outside[:5]}"
    writes = [o for o in opened if ((o[2] or 0) & _WRITE_FLAGS or (o[1] or "r").strip("rb")) and o[0] != os.devnull]
    assert not writes, f"opened for writing: {writes[:5]}"
    changed = {e[1] for e in events if e[0] in ("os.remove", "os.unlink", "os.rename", "os.mkdir", "os.rmdir",
                                                   "os.chmod", "os.chown", "os.symlink", "os.link", "os.truncate")}
    assert changed <= {sock}, f"touched files other than its socket: {changed - {sock}}"
    for e in events:
        if e[0] in ("socket.bind", "socket.connect"):
            assert sock in str(e), f"{e[0]} to something other than its own socket: {e}"
        if e[0] == "socket.__new__":  # (socket, family, type, proto)
            assert e[2] in (int(socket.AF_UNIX), -1), f"a non-Unix socket: {e}"
    assert not [e for e in events if e[0] in _RUNS_SOMETHING], "started a process"


def test_options_are_only_the_documented_enumerations():
    """SECURITY.md: an annotation can choose between enumerated values of these options
    and nothing else (no paths, no XML, no commands). A new option must update SECURITY.md."""
    from pcitopo.serve.options import HookOptions, describe_options

    # every option is an enumeration
    assert set(HookOptions.model_fields) == {"mode", "on_error", "doctor", "nvlink", "mmio", "p2p_clique", "pairing",
                                             "link", "nccl_topo"}
    for name, allowed, _default, _doc in describe_options():
        assert allowed and all(isinstance(v, str) and v.isascii() and v.replace("-", "").isalpha() for v in allowed), name


def test_the_output_carries_no_new_kinds_of_elements():
    """SECURITY.md: whatever the domain says, the rewrite adds only PCI controllers (with
    model, target, alias, address and node children) and guest addresses; it never adds
    qemu:commandline, qemu:override, hostdevs or anything else QEMU would act on."""
    from testkit.strategies import build_domain, fixture_world

    world = fixture_world("hgx-h100")
    xml = build_domain(world, world.assignable[:10])
    out = rewrite_domain(xml, world.host).xml

    def tags(data: bytes) -> Counter:
        root = etree.fromstring(data)
        return Counter(el.tag for el in root.iter() if isinstance(el.tag, str))

    added = tags(out) - tags(xml)
    q = "{http://libvirt.org/schemas/domain/qemu/1.0}"
    # the MMIO settings and P2P cliques, a fixed set of elements and property names
    mmio = {"maxphysaddr", "feature", f"{q}override", f"{q}device", f"{q}frontend", f"{q}property"}
    # one fw_cfg <sysinfo> with one entry of a fixed name, its value base64
    fwcfg = {"sysinfo", "entry"}
    assert set(added) <= {"controller", "model", "target", "alias", "address", "node"} | mmio | fwcfg, added
    assert tags(out)["hostdev"] == tags(xml)["hostdev"]
    assert tags(out)[f"{q}commandline"] == tags(xml)[f"{q}commandline"]
    root = etree.fromstring(out)
    aliases = {a.get("name") for a in root.iter("alias")}
    for p in root.iter(f"{q}property"):
        if p.get("name") in ("x-speed", "x-width"):  # QEMU's enumerated link values
            assert p.get("value") in ("2_5", "5", "8", "16", "32", "64", "1", "2", "4", "12"), p.attrib
            assert p.getparent().getparent().get("alias").startswith("ua-pcitopo-rp-")
            continue
        assert p.get("name") in ("pref64-reserve", "x-nv-gpudirect-clique") and p.get("value").isdigit(), p.attrib
        assert p.getparent().getparent().get("alias") in aliases
    import base64

    entries = [e for si in root.iter("sysinfo") for e in si.iter("entry")]
    assert [e.get("name") for e in entries] == ["opt/io.kubevirt.pcitopo/nccl-topo.xml.b64"]
    assert base64.b64decode(entries[0].text, validate=True).startswith(b'<system version="1">')
    assert all(f.get("name") == "pdpe1gb" for f in root.iter("feature") if f.getparent().tag == "cpu")


def _plan_lines(xml: bytes, host) -> int:
    """Python lines executed in src/pcitopo/guest/plan.py for one rewrite: a deterministic measure of
    work (no clocks)."""
    import pcitopo.guest.plan as plan_mod

    target = plan_mod.__file__
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        if frame.f_code.co_filename != target:
            return None
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        rewrite_domain(xml, host)
    except PcitopoError:
        pass
    finally:
        sys.settrace(None)
    return count


def _controller_chain(n: int) -> bytes:
    """base.xml plus a chain of n foreign switch ports, each plugged into the previous one,
    so the deepest (highest index) is the only one empty at first: what a hostile earlier hook
    could hand us. All of them must go (they carry nothing)."""
    base = (HOSTILE / "domains/base.xml").read_text()
    ctl = ['<controller type="pci" index="0" model="pcie-root"></controller>',
           '<controller type="pci" index="1" model="pcie-root-port">'
           '<address type="pci" domain="0x0000" bus="0x00" slot="0x02" function="0x0"></address></controller>']
    for i in range(2, n):
        model = "pcie-switch-upstream-port" if i % 2 == 0 else "pcie-switch-downstream-port"
        ctl.append(f'<controller type="pci" index="{i}" model="{model}">'
                   f'<address type="pci" domain="0x0000" bus="{i - 1}" slot="0x00" function="0x0"></address></controller>')
    return base.replace('<controller type="usb"', "".join(ctl) + '<controller type="usb"', 1).encode()


def test_controller_takeover_work_grows_linearly():
    """Regression (found here, fixed in 0764344): removing foreign controllers left empty
    repeated a full pass per removal, O(N^2): 8,000 chained ports (1.3 MB) took 33 s, an 8 MiB
    domain would have taken tens of minutes against virt-launcher's 1-minute deadline."""
    host = open_host(REPO / "fixtures" / "hgx-h100")
    small, large = _plan_lines(_controller_chain(150), host), _plan_lines(_controller_chain(600), host)
    # Linear work: 4x the controllers, ~4x the lines (allow 6x); quadratic is ~16x.
    assert large <= 6 * small, f"150 controllers: {small} lines; 600 controllers: {large} lines"
