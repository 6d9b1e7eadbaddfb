"""What each hook call does, gRPC aside: the call log, the host model and the doctor's
findings reused across calls (:class:`HostCache`), the failure kinds' status codes, and
:class:`Hooks`, which every API version's servicer calls.

:mod:`pcitopo.serve.server` carries the bytes (gRPC over the Unix socket); a failure here is a
:class:`CallFailed`, which the transport turns into the call's status.

:class:`HostCache` ends the reuse, and the model is read again from the source, when the
capture ``--sysfs`` names is replaced (its identity, checked on every call), or when a device a
call placed was rebound (its ``driver`` link) or changed IOMMU group (its ``iommu_group`` link;
both checked on every call for that call's devices, ``pcitopo.host.freshness``); the doctor's
findings go with the model they were computed on. What the doctor reads beyond the model
(config space, driver_override) is read again only then: an unprivileged sidecar cannot read
the capabilities part of config space at all (its ACS and ATS checks say ``unknown``), and
driver_override matters together with a rebind.

The hook handler (:mod:`pcitopo.serve.core`: the rewrite, the doctor, the options' pydantic model)
is imported by the first OnDefineDomain, not with this module: virt-launcher's Info (1 s
deadline) never waits for it, its first OnDefineDomain (a minute) pays it once.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from pcitopo import __version__
from pcitopo.errors import DomainError, PcitopoError
from pcitopo.host.freshness import Identity, capture_identity, changed_devices
from pcitopo.host.sysfs import open_host
from pcitopo.model.tree import Bdf, Topology
from pcitopo.program import one_line
from pcitopo.serve import wire
from pcitopo.serve.wire import INFO_NAME, ON_DEFINE_DOMAIN, SHUTDOWN, VERSIONS

# -- logging ---------------------------------------------------------------------------------

class JsonLog:
    """One JSON object per line on a text stream; safe across threads."""

    def __init__(self, stream=None):
        self._stream = stream if stream is not None else sys.stderr
        self._lock = threading.Lock()

    def __call__(self, event: str, level: str = "info", **fields: Any) -> None:
        now = datetime.now(UTC)
        rec = {"ts": now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z", "level": level, "event": event}
        rec.update({k: v for k, v in fields.items() if v is not None})
        line = json.dumps(rec, separators=(",", ":"), default=str)
        with self._lock:
            try:
                self._stream.write(line + "\n")
                self._stream.flush()
            except (OSError, ValueError):
                pass  # a closed stderr must not fail a call


# -- the host model and the doctor's findings, reused across calls -----------------------------

class HostCache:
    """Opens the host model once and shares it across calls and threads; an error is retried
    on the next call (the caller gets the same one-line SysfsError until the path becomes
    readable). ``on_reopen(reason)`` is told whenever the model is read again."""

    def __init__(self, path: str, on_reopen: Callable[[str], None] | None = None):
        self.path = path
        self.on_reopen = on_reopen
        self._lock = threading.Lock()
        self._topology: Topology | None = None
        self._identity: Identity = None

    def __call__(self) -> Topology:
        ident = capture_identity(self.path)
        topo = self._topology
        if topo is not None and ident == self._identity:
            return topo
        with self._lock:
            if self._topology is None or ident != self._identity:
                self._open(ident, None if self._topology is None else f"new capture at {self.path}")
            return self._topology

    def _open(self, ident: Identity, reason: str | None) -> None:
        """Read the model again (under the lock); the doctor's findings go with the old one."""
        topo = open_host(self.path)
        self._topology, self._identity = topo, ident
        if reason is not None and self.on_reopen is not None:
            self.on_reopen(reason)

    def current(self, topo: Topology, bdfs: Sequence[Bdf]) -> Topology:
        """``topo`` when its driver and IOMMU group of every device in ``bdfs`` are still the
        host's; otherwise the model read again (another call may have done so already)."""
        changed = changed_devices(topo, bdfs)
        if not changed:
            return topo
        with self._lock:
            if self._topology is topo:
                self._open(capture_identity(self.path), "; ".join(changed))
            return self._topology


# -- the calls -------------------------------------------------------------------------------

_GRPC_CODE = {
    "config": "INVALID_ARGUMENT",
    "vmi": "INVALID_ARGUMENT",
    "domain": "INVALID_ARGUMENT",
    "malformed-bdf": "INVALID_ARGUMENT",
    "unknown-device": "FAILED_PRECONDITION",
    "sysfs": "FAILED_PRECONDITION",
    "plan": "FAILED_PRECONDITION",
    "doctor": "FAILED_PRECONDITION",  # doctor: require, and a check failed: the host is not ready
    "internal": "INTERNAL",
    "fabric": "FAILED_PRECONDITION",
    "nvlink": "FAILED_PRECONDITION",
    "pairing": "FAILED_PRECONDITION",  # pairing: require, and a GPU got a worse NIC than the host has
    # The host's address width cannot hold the BARs; a firmware limit under on-error: fail
    "mmio": "FAILED_PRECONDITION",
    "mmio-firmware": "FAILED_PRECONDITION",
    "output": "FAILED_PRECONDITION",  # doctor --prometheus-out/--nfd-out: the host's file system refuses the write
    "kubelet": "FAILED_PRECONDITION",  # kubelet would refuse the pod: no domain can come of it
    # The base class raised as is: a failure no subclass names is our bug, not the caller's input.
    "error": "INTERNAL",
}


def status_name(err: PcitopoError) -> str:
    """The gRPC status code (its name) a failure of this kind ends the call with."""
    return _GRPC_CODE.get(err.kind, "UNKNOWN")


def error_details(err: PcitopoError) -> str:
    """The gRPC status details: one line, prefixed so virt-launcher's log names us."""
    return f"pcitopo: {err.kind}: {err.reason}"


class CallFailed(Exception):
    """A call that ends with a gRPC error: the status code's name and the one-line details."""

    def __init__(self, code: str, details: str):
        super().__init__(details)
        self.code = code
        self.details = details


class Hooks:
    """What every version's servicer calls; owns the call counter, the log and the stop event.
    Knows nothing of gRPC: a failure is a :class:`CallFailed`, which the transport turns into
    the call's status."""

    def __init__(self, host: HostCache, log: JsonLog, stop: threading.Event, fabric: Callable | None = None,
                 permitted: Any = None, doctor_file: Any = None):
        self.host = host
        # the node hook's KubeVirt permittedHostDevices (kubevirt.hostdevices.PermittedHostDevices), or None
        self.permitted = permitted
        self.fabric = fabric  # pcitopo.paths.fabric.FabricFile, or None without --fabric
        # the doctor's report (pcitopo.serve.plugin.doctorfile.DoctorFile) for the domain hook's unknown checks, or None
        self.doctor_file = doctor_file
        self.log = log
        self.stop = stop
        self._calls = 0
        self._lock = threading.Lock()

    def info(self) -> bytes:
        self.log("Info", name=INFO_NAME, pcitopo_version=__version__, versions=list(VERSIONS))
        return wire.INFO_RESULT

    def on_define_domain(self, version: str, domain_xml: bytes, vmi_json: bytes) -> bytes:
        """The hook sidecar's door (``hooks.kubevirt.io/hookSidecars``): KubeVirt v1.6 to v1.9."""
        return self._define(ON_DEFINE_DOMAIN, {"door": "hook", "version": version}, domain_xml, vmi_json)

    def mutate_domain(self, domain_type: str, domain_xml: bytes, vmi_json: bytes, context: str) -> bytes:
        """The Plugin's door (VEP 190, KubeVirt v1.9 and later): the same rewrite on ``Boot``.
        Other contexts get the domain back as sent (with libvirt's default hostdev mode, which
        KubeVirt needs to read it): ``MigrationTarget``'s reply is not used by virt-launcher, and
        a VM with passthrough devices cannot live-migrate anyway."""
        from pcitopo.serve.plugin.devices import shown

        fields = {"door": "plugin", "context": shown(context) if context else None}
        why = plugin_context_skip(domain_type, context)
        if why is None:
            return self._define(MUTATE_DOMAIN, fields, domain_xml, vmi_json)
        from pcitopo.libvirt.lenient import with_hostdev_modes

        out, moded = with_hostdev_modes(domain_xml)
        self.log(MUTATE_DOMAIN, level="warning" if context not in PLUGIN_CONTEXTS else "info", **fields,
                 domain_type=shown(domain_type) if domain_type else None, vmi=_vmi_ref(vmi_json), outcome="unchanged", reason=why,
                 hostdev_modes_given=moded or None)
        if not out.strip():
            raise CallFailed("INVALID_ARGUMENT", "pcitopo: domain: the domain XML is empty")
        return out

    def _next_call(self) -> int:
        """The call's number in this process, for the log (every door counts in one sequence)."""
        with self._lock:
            self._calls += 1
            return self._calls

    def _define(self, event: str, door: dict[str, Any], domain_xml: bytes, vmi_json: bytes) -> bytes:
        call = self._next_call()
        t0 = time.perf_counter()
        from pcitopo.serve import core

        try:
            out = core.handle_define_domain(domain_xml, vmi_json, self.host, self.fabric, self.doctor_file)
        except PcitopoError as e:
            self.log(
                event, level="error", **door, vmi=_vmi_ref(vmi_json), call=call,
                outcome="failed", error=e.kind, reason=e.reason, duration_ms=elapsed_ms(t0),
            )
            raise CallFailed(status_name(e), error_details(e)) from None
        except Exception as e:  # core wraps bugs already; this is the door's last line of defence
            reason = f"{type(e).__name__}: {e}"
            self.log(event, level="error", **door, call=call, outcome="failed", error="internal", reason=reason, duration_ms=elapsed_ms(t0))
            raise CallFailed("INTERNAL", f"pcitopo: internal: {one_line(reason)}") from None
        if len(out.xml) + wire.REPLY_FRAMING_BYTES > wire.MAX_REPLY_BYTES:  # only a reply the client can read
            e = DomainError(
                f"the {out.outcome} domain is {len(out.xml)} bytes: virt-launcher's gRPC client (grpc-go defaults) "
                f"refuses replies over {wire.MAX_REPLY_BYTES} bytes, so the VM could not start with it"
            )
            self.log(event, level="error", **door, vmi=out.vmi.ref, call=call, outcome="failed",
                     error=e.kind, reason=e.reason, in_bytes=len(domain_xml), out_bytes=len(out.xml), duration_ms=elapsed_ms(t0))
            raise CallFailed("RESOURCE_EXHAUSTED", error_details(e))
        self.log(
            event, level="warning" if out.outcome == "passthrough" else "info", **door,
            vmi=out.vmi.ref, call=call, outcome=out.outcome, reason=out.reason, duration_ms=elapsed_ms(t0),
            in_bytes=len(domain_xml), out_bytes=len(out.xml), **out.summary,
        )
        return out.xml

    def execute_node_hook(self, hook_point: str, vmi_json: bytes, node: str) -> None:
        """The Plugin's node hook (virt-handler, ``PreVMStart``): the doctor's checks for the
        VM's devices on this node (``pcitopo.serve.plugin.nodehook``); a refusal is a CallFailed."""
        call = self._next_call()
        t0 = time.perf_counter()
        from pcitopo.serve.plugin import nodehook
        from pcitopo.serve.plugin.devices import shown

        node = shown(node) if node else ""  # it reaches the log and the refusal: bounded, like every name we log
        fields: dict[str, Any] = {"door": "node-hook", "hook_point": shown(hook_point) if hook_point else None,
                                  "node": node or None, "call": call}
        if hook_point != PRE_VM_START:  # not parsed: nothing of it is needed
            self.log(EXECUTE_NODE_HOOK, **fields, outcome="ignored", reason=f"pcitopo checks nodes at {PRE_VM_START} only")
            return
        vmi = None
        try:
            vmi = nodehook.NodeVmi.read(vmi_json)  # the one parse of the call
            verdict = nodehook.check_node(vmi, node, self.host, self.permitted)
        except PcitopoError as e:
            self.log(EXECUTE_NODE_HOOK, level="error", **fields, vmi=vmi.facts.ref if vmi else None, outcome="failed",
                     error=e.kind, reason=e.reason, duration_ms=elapsed_ms(t0))
            raise CallFailed(status_name(e), error_details(e)) from None
        except Exception as e:  # a bug: one line, and the VM's start is the Plugin's failureStrategy's call
            reason = one_line(f"{type(e).__name__}: {e}")
            self.log(EXECUTE_NODE_HOOK, level="error", **fields, outcome="failed", error="internal", reason=reason,
                     duration_ms=elapsed_ms(t0))
            # The exception's text stays in our log: the refusal reaches the VM owner's events.
            raise CallFailed("INTERNAL", "pcitopo: internal: the node hook failed on this VMI (its log says why)") from None
        refused = verdict.refusal
        found = dict(verdict.fields)
        reason = found.pop("reason", None)
        self.log(EXECUTE_NODE_HOOK, level="info" if verdict.outcome != "not-ready" else ("error" if refused else "warning"),
                 **fields, outcome="refused" if refused else verdict.outcome, **found,
                 reason=refused.reason if refused else reason, duration_ms=elapsed_ms(t0))
        if refused is not None:
            raise CallFailed(status_name(refused), error_details(refused))

    def pre_cloud_init_iso(self, version: str) -> None:
        self.log("PreCloudInitIso", version=version, outcome="unchanged")

    def shutdown(self) -> None:
        self.log(SHUTDOWN, reason="virt-launcher asked us to stop")
        self.stop.set()


MUTATE_DOMAIN = "MutateDomain"
EXECUTE_NODE_HOOK = "ExecuteNodeHook"
PRE_VM_START = "PreVMStart"
# The invocation contexts KubeVirt's plugin API names (pkg/hooks/plugins/v1alpha1); virt-launcher
# v1.9 sends Boot for every define of a boot and MigrationTarget on a migration's target.
BOOT = "Boot"
PLUGIN_CONTEXTS = (BOOT, "MigrationSource", "MigrationTarget")
LIBVIRT_DOMAIN = "libvirt"


def plugin_context_skip(domain_type: str, context: str) -> str | None:
    """Why a MutateDomain call leaves the domain as sent, or None when it is rewritten."""
    if domain_type and domain_type != LIBVIRT_DOMAIN:
        return f"domain_type {domain_type[:40]!r}: pcitopo rewrites libvirt domains only"
    if context == BOOT:
        return None
    if context.startswith("Migration"):
        return (f"invocation context {context[:40]}: a VM with passthrough GPUs and NICs cannot live-migrate, "
                f"and virt-launcher does not use this reply; left as sent")
    return f"invocation context {context[:40]!r} is not one pcitopo knows ({', '.join(PLUGIN_CONTEXTS)}); left as sent"


def elapsed_ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 2)


def _vmi_ref(vmi_json: bytes) -> str:
    from pcitopo.serve.options import parse_vmi

    try:
        return parse_vmi(vmi_json).ref
    except PcitopoError:
        return "-/-"
