"""The NVLink fabric check through the socket: `pcitopo serve --fabric FILE` refuses a VM whose
GPUs are not exactly one active partition (under `nvlink: require`) with a gRPC error carrying
the same line xmlfix prints, boots it under `warn` and says why in the log line, and re-reads
the fabric file when it changes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import grpc
import pytest

from testkit import REPO
from testkit.fabric_kit import domain_with_modules, fabric, module_map, vmi_with
from testkit.hookkit import VirtLauncher, fixture_sysfs, xmlfix
from testkit.server_proc import ServerProcess, serve_argv, wait_for_socket


@pytest.fixture
def hooks_dir():
    d = Path(tempfile.mkdtemp(prefix="pcitopo-hooks-"))
    (d / "hook-sidecar-0").mkdir()
    yield d
    shutil.rmtree(d)


@pytest.fixture
def serve(hooks_dir, tmp_path):
    started: list[ServerProcess] = []

    def _serve(board: str, *extra: str) -> tuple[ServerProcess, VirtLauncher]:
        sock = hooks_dir / "hook-sidecar-0" / "pcitopo.sock"
        srv = ServerProcess(serve_argv(sock, fixture_sysfs(board)) + list(extra), tmp_path / f"server-{len(started)}.log")
        started.append(srv)
        wait_for_socket(sock, proc=srv.proc)
        launcher = VirtLauncher(hooks_dir)
        launcher.collect()
        return srv, launcher

    yield _serve
    for srv in started:
        srv.stop()


def refusal(launcher: VirtLauncher, domain: bytes, vmi: bytes) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        launcher.on_define_domain(domain, vmi)
    return err.value


def define_calls(srv: ServerProcess) -> list[dict]:
    return [r for r in srv.log_lines() if r.get("event") == "OnDefineDomain"]


CASES = [
    ("hgx-h100", {1, 2}, "active", "no fabric partition"),
    ("hgx-h100", {2, 4}, "active", "fmpm -a 4"),
    ("hgx-h100", {1, 3}, "degraded", "16 of 18 NVLinks"),
    ("hgx-b200", {1, 3}, "active", "no fabric partition"),
]


@pytest.mark.parametrize("board,modules,variant,words", CASES, ids=lambda x: str(x))
def test_require_refuses_with_the_line_xmlfix_prints(serve, tmp_path, board, modules, variant, words):
    srv, launcher = serve(board, "--fabric", fabric(board, variant))
    domain, vmi = domain_with_modules(board, modules), vmi_with("require")
    err = refusal(launcher, domain, vmi)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = err.details()
    assert details.startswith("pcitopo: nvlink: ") and words in details and "\n" not in details
    without = xmlfix(domain, fixture_sysfs(board), vmi, tmp_path)  # no fabric file at all: says so
    assert without.returncode == 2 and b"no fabric file" in without.stderr
    # the same file through the environment: the same line
    env = dict(os.environ, PYTHONPATH=str(REPO), PCITOPO_FABRIC=fabric(board, variant))
    vmi_file = tmp_path / "vmi.json"
    vmi_file.write_bytes(vmi)
    same = subprocess.run([str(Path(sys.executable).parent / "xmlfix"), "--sysfs", fixture_sysfs(board), "--vmi", str(vmi_file), "-"],
                          input=domain, capture_output=True, env=env, cwd=REPO, timeout=60)
    assert same.returncode == 2
    assert same.stderr.decode().strip() == "xmlfix: " + details[len("pcitopo: nvlink: "):]
    rec = define_calls(srv)[-1]
    assert rec["outcome"] == "failed" and rec["error"] == "nvlink" and rec["reason"] == details[len("pcitopo: nvlink: "):]


@pytest.mark.parametrize("board,modules", [("hgx-h100", {1, 3}), ("hgx-b200", {1, 2})])
def test_require_boots_an_exact_active_partition_three_calls_in_a_row(serve, board, modules):
    srv, launcher = serve(board, "--fabric", fabric(board, "active"))
    history = launcher.boot(domain_with_modules(board, modules), vmi_with("require"))
    assert len(history) == 3
    calls = define_calls(srv)
    assert [c["outcome"] for c in calls] == ["rewritten"] * 3 and all(c["nvlink"] == "ok" for c in calls)


def test_warn_boots_and_says_why_in_the_log_line(serve):
    srv, launcher = serve("hgx-h100", "--fabric", fabric("hgx-h100", "active"))
    out = launcher.on_define_domain(domain_with_modules("hgx-h100", {1, 2}), vmi_with("warn"))
    assert b"pcie-expander-bus" in out
    rec = define_calls(srv)[-1]
    assert rec["outcome"] == "rewritten" and rec["level"] == "info"
    assert rec["nvlink"] == "not-a-partition" and "nearest valid GPU sets" in rec["nvlink_reason"]


def test_the_fabric_file_is_reread_when_it_changes(serve, tmp_path):
    live = tmp_path / "fabric.json"
    shutil.copy(fabric("hgx-h100", "active"), live)
    srv, launcher = serve("hgx-h100", "--fabric", str(live))
    started = [r for r in srv.log_lines() if r.get("event") == "fabric"]
    assert started and started[0]["active"] == [3] and started[0]["bdf_source"] == "fabric file"
    domain, vmi = domain_with_modules("hgx-h100", {2, 4}), vmi_with("require")
    assert "fmpm -a 4" in refusal(launcher, domain, vmi).details()
    doc = json.loads(live.read_text())
    for p in doc["partitionInfo"]:
        p["isActive"] = int(p["partitionId"] in (3, 4))  # the operator ran `fmpm -a 4` and refreshed the file
    tmp = tmp_path / "fabric.json.new"
    tmp.write_text(json.dumps(doc))
    tmp.replace(live)
    assert b"pcie-expander-bus" in launcher.on_define_domain(domain, vmi)


def test_placeholder_bdfs_with_the_module_map_through_the_socket(serve):
    srv, launcher = serve("hgx-b200", "--fabric", fabric("hgx-b200", "vfio"), "--module-map", module_map("hgx-b200"))
    launcher.on_define_domain(domain_with_modules("hgx-b200", {1, 2}), vmi_with("require"))
    err = refusal(launcher, domain_with_modules("hgx-b200", {3, 4}), vmi_with("require"))
    assert "fmpm -a 4" in err.details()
    assert [r for r in srv.log_lines() if r.get("event") == "fabric"][0]["bdf_source"] == "module map"


def test_a_hostile_fabric_file_is_logged_at_start_and_named_on_every_call(serve):
    bad = str(REPO / "tests/hostile_fabric/truncated.json")
    srv, launcher = serve("hgx-h100", "--fabric", bad)
    start = [r for r in srv.log_lines() if r.get("event") == "fabric"][0]
    assert start["level"] == "error" and "truncated.json: not JSON" in start["reason"]
    domain = domain_with_modules("hgx-h100", {1, 3})
    err = refusal(launcher, domain, vmi_with("require"))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and err.details().startswith("pcitopo: fabric: ")
    out = launcher.on_define_domain(domain, vmi_with("warn"))  # warn boots, and says why
    assert b"pcie-expander-bus" in out
    rec = define_calls(srv)[-1]
    assert rec["nvlink"] == "fabric-error" and "not JSON" in rec["nvlink_reason"]


def test_the_shim_way_reads_the_fabric_from_the_environment():
    """KubeVirt's sidecar-shim passes only --vmi and --domain: PCITOPO_FABRIC names the file."""
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, PCITOPO_SYSFS=fixture_sysfs("hgx-h100"), PCITOPO_FABRIC=fabric("hgx-h100", "active"))
    env.pop("PCITOPO_MODULE_MAP", None)

    def shim(modules: set[int], policy: str) -> subprocess.CompletedProcess:
        dom = domain_with_modules("hgx-h100", modules)
        return subprocess.run([str(bin_dir / "onDefineDomain"), "--vmi", vmi_with(policy).decode(), "--domain", dom.decode()],
                              capture_output=True, env=env, cwd="/", timeout=120)

    bad = shim({1, 2}, "require")
    assert bad.returncode == 2 and not bad.stdout
    assert bad.stderr.decode().startswith("onDefineDomain: nvlink: GPUs 0000:2a:00.0,0000:5d:00.0 are modules {1,2}")
    good = shim({1, 3}, "require")
    assert good.returncode == 0 and b"pcie-expander-bus" in good.stdout
    assert json.loads(good.stderr.decode().splitlines()[-1])["nvlink"] == "ok"
