"""Pcitopo's Plugin hooks against an independent grpc-go client built from
proto/testkit/hookproto/plugins_v1alpha1.proto (tests/sidecar/goclient/plugin), called as
KubeVirt v1.9 calls them: MutateDomain on the domain hook's socket under
/var/run/kubevirt-plugin/<plugin>/ (virt-launcher), ExecuteNodeHook on the node hook's socket
(virt-handler). The server is the real `pcitopo serve` process; the three chained defines put
KubeVirt v1.9.0's re-parse and libvirtxml's round trip (testkit/plugin) between the calls.
The image itself, run as KubeVirt runs it, is tests/sidecar/test_image.py's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from testkit.goclient import hookclient_or_skip
from testkit.hookkit import fixture_domain, fixture_sysfs, placement, vmi_json, xmlfix
from testkit.plugin.pipeline import as_libvirtxml, boot
from testkit.server_proc import ServerProcess, serve_argv

FIXTURES = ("hgx-b200", "hgx-h100", "dgx-h100")
PLUGIN_ROOT = Path("/var/run/kubevirt-plugin")


@pytest.fixture(scope="module")
def client() -> Path:
    return hookclient_or_skip("pluginclient")


def call(client: Path, socket: Path, *args: str) -> dict:
    r = subprocess.run([str(client), "-socket", str(socket), *args], capture_output=True, timeout=120)
    lines = r.stdout.decode().strip().splitlines()
    assert lines, f"pluginclient printed nothing (exit {r.returncode}): {r.stderr.decode(errors='replace')[:2000]}"
    rep = json.loads(lines[-1])
    assert (r.returncode == 0) == rep["ok"], rep
    return rep


@pytest.fixture(scope="module")
def plugin_servers(tmp_path_factory):
    """One domain-hook server per fixture host, each a Plugin of its own name, on the very path
    KubeVirt v1.9 dials (needs root to create /var/run/kubevirt-plugin/<name>/)."""
    if not os.access(PLUGIN_ROOT.parent, os.W_OK):
        pytest.skip(f"needs write access to {PLUGIN_ROOT.parent} (root) for the plugin socket folder")
    made, servers = [], {}
    try:
        for name in FIXTURES:
            plugin = f"pcitopo-test-{os.getpid()}-{name}"
            folder = PLUGIN_ROOT / plugin
            folder.mkdir(parents=True)
            made.append(folder)
            argv = [*serve_argv(folder / "domain.sock", fixture_sysfs(name)), "--plugin", plugin]
            srv = ServerProcess(argv, tmp_path_factory.mktemp("plugin") / "server.log", socket=folder / "domain.sock")
            servers[name] = srv
            srv.wait_for_socket()
        yield servers
    finally:
        for srv in servers.values():
            srv.stop()
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)


def mutate(client: Path, socket: Path, domain: bytes, tmp: Path, context: str = "Boot",
           annotations: dict[str, str] | None = None) -> tuple[dict, bytes | None]:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "in.xml").write_bytes(domain)
    (tmp / "vmi.json").write_bytes(vmi_json(domain, annotations))
    out = tmp / "out.xml"
    out.unlink(missing_ok=True)
    rep = call(client, socket, "mutate", "-domain", str(tmp / "in.xml"), "-vmi", str(tmp / "vmi.json"),
               "-context", context, "-out", str(out))
    return rep, out.read_bytes() if rep["ok"] else None


@pytest.mark.parametrize("name", FIXTURES)
def test_grpc_go_three_chained_defines_keep_what_xmlfix_writes(client, plugin_servers, tmp_path, name):
    """Per fixture: KubeVirt v1.9.0's three defines with the legacy hook and the plugin (both
    pcitopo), the plugin called over its socket by grpc-go. Every define equals xmlfix's output
    for the domain the plugin got, as libvirtxml reads both."""
    srv = plugin_servers[name]
    calls = iter(range(100))

    def plugin(domain: bytes) -> bytes:
        rep, out = mutate(client, srv.socket, domain, tmp_path / f"call{next(calls)}")
        assert rep["ok"], rep
        return out

    def legacy(domain: bytes) -> bytes:
        r = xmlfix(domain, fixture_sysfs(name), vmi_json(domain), tmp_path)
        assert r.returncode == 0, r.stderr
        return r.stdout

    b = boot(fixture_domain(name), legacy=legacy, plugins=[plugin])
    assert b.error is None and len(b.defines) == 3
    for sent, defined in zip(b.plugin_inputs, b.defines):
        expected = xmlfix(sent, fixture_sysfs(name), vmi_json(sent), tmp_path)
        assert expected.returncode == 0, expected.stderr
        assert defined == as_libvirtxml(expected.stdout)
    first = xmlfix(fixture_domain(name), fixture_sysfs(name), None, tmp_path).stdout
    assert placement(b.defines[-1]) == placement(first)
    for setting in (b"<maxphysaddr", b'name="x-speed"', b'<sysinfo type="fwcfg">', b'<model name="pxb-pcie">', b"busNr=",
                    b'<hostdev mode="subsystem"'):
        assert setting in b.defines[-1], setting
    served = [r for r in srv.log_lines() if r.get("event") == "MutateDomain"][-3:]
    assert [(r["door"], r["context"], r["outcome"]) for r in served] == [("plugin", "Boot", "rewritten")] * 3


def test_grpc_go_migration_target_gets_the_domain_back(client, plugin_servers, tmp_path):
    srv = plugin_servers["hgx-b200"]
    domain = as_libvirtxml(xmlfix(fixture_domain("hgx-b200"), fixture_sysfs("hgx-b200"), None, tmp_path).stdout)
    rep, out = mutate(client, srv.socket, domain, tmp_path, context="MigrationTarget")
    assert rep["ok"] and out == domain
    last = [r for r in srv.log_lines() if r.get("event") == "MutateDomain"][-1]
    assert last["outcome"] == "unchanged" and "cannot live-migrate" in last["reason"]


def test_grpc_go_sees_a_refusal_as_one_line(client, plugin_servers, tmp_path):
    srv = plugin_servers["hgx-b200"]
    rep, _ = mutate(client, srv.socket, fixture_domain("hgx-b200"), tmp_path,
                    annotations={"pcitopo.kubevirt.io/pairing": "always"})
    assert not rep["ok"] and rep["code"] == "InvalidArgument"
    assert rep["message"].startswith("pcitopo: config: annotation pcitopo.kubevirt.io/pairing") and "\n" not in rep["message"]


def test_the_plugin_refuses_a_socket_virt_launcher_would_never_dial(tmp_path):
    r = subprocess.run([*serve_argv(tmp_path / "domain.sock", fixture_sysfs("hgx-b200")), "--plugin", "pcitopo"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "is not directly in /var/run/kubevirt-plugin/pcitopo/" in r.stderr and "/var/run/kubevirt-plugin/pcitopo/domain.sock" in r.stderr


# The node hook's tests, through the same client: tests/sidecar/test_plugin_nodehook.py.
