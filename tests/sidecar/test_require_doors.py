"""`pcitopo.kubevirt.io/doctor: require` on the doors that know the VM's devices: the hook
sidecar (OnDefineDomain from grpc-go, as virt-launcher calls it; and the sidecar-shim's
`onDefineDomain`) and the Plugin's domain hook (MutateDomain). The server reads the host as an
unprivileged container does (config space cut to 64 bytes) and takes ACS and ATS from the
doctor's report (`serve --doctor-report`); a DRA GPU whose root port fails ACS does not start,
and the refusal names the check. The refusal lines are printed (-s) for the record."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest

from testkit.goclient import hookclient_or_skip
from testkit.hookkit import fixture_domain, fixture_sysfs, vmi_json
from testkit.server_proc import BIN, ServerProcess, serve_argv

GPU7 = "0000:db:00.0"  # below 0000:d9:01.0, ACS RR cleared (fixtures/hgx-h100-faults/README.md)
GPU0 = "0000:18:00.0"  # nothing fails on or above it
REQUIRE = {"pcitopo.kubevirt.io/doctor": "require"}
ACS_REFUSAL = ("pcitopo: doctor: host not ready (annotation pcitopo.kubevirt.io/doctor is require): acs downstream-port "
               "above GPU7 0000:d9:01.0: ACS control 0x59 (SV|CR|UF|DT): RR/CR cleared")
PLUGIN_ROOT = Path("/var/run/kubevirt-plugin")


def dra_gpu(bdf: str) -> tuple[bytes, bytes]:
    """One DRA GPU at ``bdf``, as KubeVirt v1.9 writes its domain (alias ua-dra-gpu-<name>) and
    VMI (gpus[] with claimName/requestName, no deviceName), under doctor: require."""
    dom, bus_slot = bdf.split(":", 1)
    bus, slot = bus_slot.split(":")[0], bus_slot.split(":")[1].split(".")[0]
    domain = fixture_domain("hgx-h100", "one-pair")
    start = domain.index(b"<hostdev", domain.index(b"ua-gpu-gpu0"))  # the NIC's hostdev, after the GPU's
    domain = domain[:start] + domain[domain.index(b"</hostdev>", start) + len(b"</hostdev>"):]
    domain = (domain.replace(b'bus="0x18" slot="0x00"', f'bus="0x{bus}" slot="0x{slot}"'.encode())
              .replace(b"ua-gpu-gpu0", b"ua-dra-gpu-gpu0"))
    vmi = json.loads(vmi_json(domain, REQUIRE))
    vmi["spec"]["domain"]["devices"]["gpus"] = [{"name": "gpu0", "claimName": "gpus", "requestName": "gpu0"}]
    vmi["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "one-h100"}]
    return domain, json.dumps(vmi).encode()


@pytest.fixture(scope="module")
def unprivileged_sysfs(tmp_path_factory) -> str:
    """hgx-h100-faults as a container without CAP_SYS_ADMIN reads it: every ``config`` cut to
    64 bytes, as the kernel cuts it (drivers/pci/pci-sysfs.c, pci_read_config)."""
    root = tmp_path_factory.mktemp("unprivileged-sys")
    with tarfile.open(Path(fixture_sysfs("hgx-h100-faults")) / "sysfs.tar.gz") as tar:
        tar.extractall(root, filter="data")
    for config in root.rglob("config"):
        if config.is_file() and not config.is_symlink():
            config.write_bytes(config.read_bytes()[:64])
    return str(root)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> str:
    """What the doctor DaemonSet writes (`pcitopo doctor --json-out`, privileged: the whole config space)."""
    out = tmp_path_factory.mktemp("doctor") / "doctor.json"
    r = subprocess.run([str(BIN / "pcitopo"), "doctor", "--sysfs", fixture_sysfs("hgx-h100-faults"), "--json-out", str(out)],
                       capture_output=True, timeout=120)
    assert r.returncode in (0, 1) and out.is_file(), r.stderr
    return str(out)


def _run(argv: list[str]) -> dict:
    r = subprocess.run(argv, capture_output=True, timeout=120)
    lines = r.stdout.decode().strip().splitlines()
    assert lines, f"client printed nothing (exit {r.returncode}): {r.stderr.decode(errors='replace')[:2000]}"
    return json.loads(lines[-1])


def _write(tmp: Path, domain: bytes, vmi: bytes) -> tuple[str, str]:
    (tmp / "in.xml").write_bytes(domain)
    (tmp / "vmi.json").write_bytes(vmi)
    return str(tmp / "in.xml"), str(tmp / "vmi.json")


def test_hook_sidecar_door_refuses_a_dra_gpu_failing_acs(unprivileged_sysfs, report, tmp_path):
    client = hookclient_or_skip()
    d = Path(tempfile.mkdtemp(prefix="pcitopo-req-"))
    (d / "hook-sidecar-0").mkdir()
    sock = d / "hook-sidecar-0" / "pcitopo.sock"
    srv = ServerProcess([*serve_argv(sock, unprivileged_sysfs), "--doctor-report", report], tmp_path / "server.log", socket=sock)
    try:
        srv.wait_for_socket()
        dom, vmi = _write(tmp_path, *dra_gpu(GPU7))
        rep = _run([str(client), "-socket", str(sock), "-domain", dom, "-vmi", vmi, "-out", str(tmp_path / "out.xml")])
        assert not rep["defined"] and "code = FailedPrecondition" in rep["error"] and ACS_REFUSAL in rep["error"], rep
        print(f"hook sidecar, DRA GPU7: {rep['error']}")
        dom, vmi = _write(tmp_path, *dra_gpu(GPU0))
        ok = _run([str(client), "-socket", str(sock), "-domain", dom, "-vmi", vmi, "-out", str(tmp_path / "out.xml")])
        assert ok["defined"], ok
    finally:
        srv.stop()
        shutil.rmtree(d, ignore_errors=True)


def test_plugin_door_refuses_a_dra_gpu_failing_acs(unprivileged_sysfs, report, tmp_path):
    client = hookclient_or_skip("pluginclient")
    if not os.access(PLUGIN_ROOT.parent, os.W_OK):
        pytest.skip(f"needs write access to {PLUGIN_ROOT.parent} (root) for the plugin socket folder")
    plugin = f"pcitopo-req-{os.getpid()}"
    folder = PLUGIN_ROOT / plugin
    folder.mkdir(parents=True)
    srv = ServerProcess([*serve_argv(folder / "domain.sock", unprivileged_sysfs), "--plugin", plugin, "--doctor-report", report],
                        tmp_path / "server.log", socket=folder / "domain.sock")
    try:
        srv.wait_for_socket()
        dom, vmi = _write(tmp_path, *dra_gpu(GPU7))
        rep = _run([str(client), "-socket", str(folder / "domain.sock"), "mutate", "-domain", dom, "-vmi", vmi,
                    "-context", "Boot", "-out", str(tmp_path / "out.xml")])
        assert not rep["ok"] and rep["code"] == "FailedPrecondition" and rep["message"].startswith(ACS_REFUSAL), rep
        assert "\n" not in rep["message"]
        print(f"Plugin domain hook, DRA GPU7: {rep['message']}")
        dom, vmi = _write(tmp_path, *dra_gpu(GPU0))
        assert _run([str(client), "-socket", str(folder / "domain.sock"), "mutate", "-domain", dom, "-vmi", vmi,
                     "-context", "Boot", "-out", str(tmp_path / "out.xml")])["ok"]
    finally:
        srv.stop()
        shutil.rmtree(folder, ignore_errors=True)


def test_shim_door_takes_the_report_from_the_environment(unprivileged_sysfs, report, tmp_path):
    """The sidecar-shim passes no flags of ours: $PCITOPO_DOCTOR_REPORT names the report; without
    one (the default path absent here) require cannot confirm ACS and refuses."""
    domain, vmi = dra_gpu(GPU7)
    argv = [str(BIN / "onDefineDomain"), "--vmi", vmi.decode(), "--domain", domain.decode(), "--sysfs", unprivileged_sysfs]
    env = {**os.environ, "PCITOPO_DOCTOR_REPORT": report}
    r = subprocess.run(argv, capture_output=True, timeout=60, env=env)
    assert r.returncode == 2 and r.stdout == b"" and r.stderr.decode().startswith(f"onDefineDomain: {ACS_REFUSAL[len('pcitopo: '):]}")
    env["PCITOPO_DOCTOR_REPORT"] = str(tmp_path / "none.json")
    r = subprocess.run(argv, capture_output=True, timeout=60, env=env)
    assert r.returncode == 2 and "host readiness not confirmed" in r.stderr.decode() and "is missing" in r.stderr.decode(), r.stderr
