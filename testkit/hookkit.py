"""Test kit for the hook sidecar: VMI JSON for the golden KubeVirt-shaped inputs, libvirt's
define-time additions, and a client that behaves like virt-launcher's hook manager. KubeVirt's
lossy re-parse is :mod:`testkit.kubevirt_sim`'s (one simulation for the whole suite).

Everything here follows KubeVirt's hook manager, ``pkg/hooks/manager.go`` (docs/SOURCES.md,
"KubeVirt around the hook"); where it leaves a choice, the choice is written next to the code. None of it stands in for our own code:
the server, the shim and the rewrite under test are the real ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from lxml import etree

from pcitopo.kubevirt.launcher.release_groups import Release
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

from . import REPO
from .kubevirt_sim import next_call_input
from .server_proc import BIN

PYTHON = sys.executable


# -- hosts and inputs -------------------------------------------------------------------------

def fixture_sysfs(name: str) -> str:
    """The path ``--sysfs`` takes for a fixture host."""
    return str(REPO / "fixtures" / name)


def fixture_domain(name: str, case: str | None = None) -> bytes:
    """A golden KubeVirt-shaped input (built by testkit/kubevirt_sim.py, committed by
    ``make golden``): ``fixtures/<name>/domain.xml`` or ``fixtures/<name>/cases/<case>/domain.xml``."""
    base = REPO / "fixtures" / name
    return ((base / "cases" / case) if case else base).joinpath("domain.xml").read_bytes()


def hostdev_aliases(domain_xml: bytes) -> list[str]:
    root = etree.fromstring(domain_xml)
    return [a.get("name") for a in root.findall("devices/hostdev/alias")]


def vmi_json(domain_xml: bytes, annotations: dict[str, str] | None = None, name: str = "gpu-vm",
             namespace: str = "ml", uid: str = "5f0e2c4a-3b1d-4c9e-9a57-2f1d0c7e8b61") -> bytes:
    """A realistic VirtualMachineInstance (a few KB) for a domain: its GPUs and host devices
    named after the domain's hostdev aliases, dedicated CPUs, hugepages, guestMappingPassthrough,
    and the hook annotations (ours under ``annotations``)."""
    aliases = hostdev_aliases(domain_xml)
    gpus = [{"name": a[len("ua-gpu-"):], "deviceName": "nvidia.com/GB200"} for a in aliases if a.startswith("ua-gpu-")]
    hostdevs = [{"name": a.split("-", 2)[-1], "deviceName": "nvidia.com/MT2910_FAMILY"} for a in aliases if not a.startswith("ua-gpu-")]
    doc = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "annotations": {
                "hooks.kubevirt.io/hookSidecars": json.dumps([{"image": "registry.example.com/pcitopo:0.1.0"}]),
                "kubevirt.io/latest-observed-api-version": "v1",
                "kubevirt.io/storage-observed-api-version": "v1",
                **(annotations or {}),
            },
            "labels": {"kubevirt.io/nodeName": "gpu-node-07", "app": "training"},
            "finalizers": ["kubevirt.io/virtualMachineControllerFinalize", "foregroundDeleteVirtualMachine"],
            "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": name,
                                 "uid": "0c0f6c59-9e7b-4b8e-8a39-5d3c8f0b7a21", "controller": True, "blockOwnerDeletion": True}],
            "generation": 1,
            "resourceVersion": "123456",
            "creationTimestamp": "2026-11-02T10:00:00Z",
        },
        "spec": {
            "domain": {
                "cpu": {"cores": 4, "threads": 1, "sockets": 4, "dedicatedCpuPlacement": True,
                        "isolateEmulatorThread": True, "numa": {"guestMappingPassthrough": {}}},
                "memory": {"hugepages": {"pageSize": "1Gi"}, "guest": "64Gi"},
                "resources": {"requests": {"memory": "64Gi"}},
                "devices": {
                    "gpus": gpus,
                    "hostDevices": hostdevs,
                    "disks": [{"name": "rootdisk", "disk": {"bus": "virtio"}}],
                    "interfaces": [{"name": "default", "masquerade": {}}],
                },
                "machine": {"type": "q35"},
            },
            "networks": [{"name": "default", "pod": {}}],
            "volumes": [{"name": "rootdisk", "containerDisk": {"image": "quay.io/containerdisks/ubuntu:24.04"}}],
            "terminationGracePeriodSeconds": 180,
        },
        "status": {"phase": "Scheduling", "nodeName": "gpu-node-07", "qosClass": "Guaranteed"},
    }
    return json.dumps(doc).encode()


# -- what happens between the calls -----------------------------------------------------------

def _int(text: str | None) -> int:
    t = (text or "0").strip().lower()
    return int(t, 16) if t.startswith("0x") else int(t)


# -- what we compare ----------------------------------------------------------------------------

def placement(xml: bytes) -> dict:
    """The part of a domain the rewrite owns, comparable across calls: our controllers
    (alias → model, index, parent address, busNr, node) and hostdev guest addresses."""
    root = etree.fromstring(xml)
    devices = root.find("devices")
    ctrls = {}
    for c in devices.findall("controller"):
        alias = c.find("alias")
        name = alias.get("name") if alias is not None else ""
        if c.get("type") == "pci" and name.startswith("ua-pcitopo-"):
            a = c.find("address")
            t = c.find("target")
            node = c.find("target/node")
            ctrls[name] = (
                c.get("model"), _int(c.get("index")),
                (_int(a.get("bus")), _int(a.get("slot")), _int(a.get("function"))) if a is not None else None,
                t.get("busNr") if t is not None else None,
                node.text if node is not None else None,
            )
    hds = {}
    for hd in devices.findall("hostdev"):
        a = hd.find("address")
        hds[hd.find("alias").get("name")] = (_int(a.get("bus")), _int(a.get("slot")), _int(a.get("function"))) if a is not None else None
    return {"controllers": ctrls, "hostdevs": hds}


# -- a client that behaves like virt-launcher ---------------------------------------------------

SUPPORTED = ("v1alpha3", "v1alpha2", "v1alpha1")
_STUBS = {
    "v1alpha1": (v1alpha1_pb2, v1alpha1_pb2_grpc),
    "v1alpha2": (v1alpha2_pb2, v1alpha2_pb2_grpc),
    "v1alpha3": (v1alpha3_pb2, v1alpha3_pb2_grpc),
}


class LauncherPanic(Exception):
    """virt-launcher would panic (VM start fails)."""


@dataclass
class Callback:
    socket: str
    version: str
    hook_points: tuple[str, ...]


class VirtLauncher:
    """virt-launcher's hook manager (KubeVirt ``pkg/hooks/manager.go``): polls ``hook-sidecar-<i>/`` under the hooks folder,
    dials each entry with a 2 s timeout (a failed dial means "not ready yet": retry), calls Info
    with a 1 s deadline (an error is fatal), picks the newest version both sides know, then
    dials a new connection per call (OnDefineDomain deadline 1 minute)."""

    def __init__(self, hooks_dir: str | Path, sidecars: int = 1, supported: Sequence[str] = SUPPORTED,
                 poll_s: float = 0.3, timeout_s: float = 60.0):
        self.hooks_dir = Path(hooks_dir)
        self.sidecars = sidecars
        self.supported = tuple(supported)
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self.callbacks: list[Callback] = []
        self.dial_failures = 0
        self.info_latency_s: float | None = None

    @staticmethod
    def dial(path: str, timeout: float = 2.0) -> grpc.Channel:
        ch = grpc.insecure_channel(f"unix:{path}")
        try:
            grpc.channel_ready_future(ch).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            ch.close()
            raise
        return ch

    def collect(self) -> list[Callback]:
        processed: set[str] = set()
        deadline = time.monotonic() + self.timeout_s
        while len(processed) < self.sidecars:
            if time.monotonic() > deadline:
                raise LauncherPanic("failed to collect all expected sidecar hook sockets within the timeout")
            for i in range(self.sidecars):
                folder = self.hooks_dir / f"hook-sidecar-{i}"
                for entry in sorted(os.listdir(folder)) if folder.is_dir() else []:
                    path = str(folder / entry)
                    if path in processed:
                        continue
                    try:
                        ch = self.dial(path)
                    except grpc.FutureTimeoutError:
                        self.dial_failures += 1
                        continue  # "sidecar server might not be ready yet"
                    try:
                        t0 = time.perf_counter()
                        info = info_pb2_grpc.InfoStub(ch).Info(info_pb2.InfoParams(), timeout=1.0)
                        self.info_latency_s = time.perf_counter() - t0
                    except grpc.RpcError as e:
                        raise LauncherPanic(f"Info on {path} failed: {e.code()} {e.details()}") from None
                    finally:
                        ch.close()
                    version = next((v for v in self.supported if v in info.versions), None)
                    if version is None:
                        raise LauncherPanic(f"{path} exposes {list(info.versions)}, we support {self.supported}")
                    self.callbacks.append(Callback(path, version, tuple(h.name for h in info.hookPoints)))
                    processed.add(path)
            if len(processed) < self.sidecars:
                time.sleep(self.poll_s)
        return self.callbacks

    def on_define_domain(self, domain_xml: bytes, vmi: bytes) -> bytes:
        for cb in self.callbacks:
            if "OnDefineDomain" not in cb.hook_points:
                continue
            pb2, pb2_grpc = _STUBS[cb.version]
            ch = self.dial(cb.socket)
            try:
                res = pb2_grpc.CallbacksStub(ch).OnDefineDomain(pb2.OnDefineDomainParams(domainXML=domain_xml, vmi=vmi), timeout=60)
            finally:
                ch.close()
            if not res.domainXML:
                raise LauncherPanic("libvirt define: EOF (the hook returned empty XML)")
            domain_xml = res.domainXML
        return domain_xml

    def shutdown(self) -> int:
        """Shutdown to every v1alpha3 sidecar subscribed to it; returns how many were told."""
        told = 0
        for cb in self.callbacks:
            if "Shutdown" in cb.hook_points and cb.version == "v1alpha3":
                ch = self.dial(cb.socket)
                try:
                    v1alpha3_pb2_grpc.CallbacksStub(ch).Shutdown(v1alpha3_pb2.ShutdownParams(), timeout=60)
                finally:
                    ch.close()
                told += 1
        return told

    def boot(self, domain_xml: bytes, vmi: bytes, calls: int = 3, decimal_bus: bool = False,
             release: Release = Release.MAIN) -> list[tuple[bytes, bytes]]:
        """OnDefineDomain ``calls`` times as a q35 boot does: each later call gets the previous
        output after libvirt's define and ``release``'s lossy re-parse. Returns (input, output)
        per call; the last output is what boots."""
        history = []
        xml = domain_xml
        for i in range(calls):
            out = self.on_define_domain(xml, vmi)
            history.append((xml, out))
            xml = next_call_input(out, release, decimal_bus=decimal_bus and i > 0)
        return history


# -- xmlfix -----------------------------------------------------------------------------------

def xmlfix(domain_xml: bytes, sysfs: str, vmi: bytes | None, tmp: Path) -> subprocess.CompletedProcess:
    """``xmlfix`` on the same input, as a process."""
    args = [str(BIN / "xmlfix"), "--sysfs", sysfs]
    if vmi is not None:
        vmi_file = tmp / f"vmi-{time.perf_counter_ns()}.json"
        vmi_file.write_bytes(vmi)
        args += ["--vmi", str(vmi_file)]
    args.append("-")
    return subprocess.run(args, input=domain_xml, capture_output=True, cwd=REPO, timeout=60)


