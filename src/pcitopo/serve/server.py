"""``pcitopo serve``: KubeVirt's hook API over a Unix socket (gRPC), a thin wrapper around
:func:`pcitopo.serve.core.handle_define_domain`.

This module is the transport only: what each call does is ``pcitopo.serve.hooks``, the messages'
bytes are ``pcitopo.serve.wire``, the process tweaks ``pcitopo.serve.process``, the programs'
shared plumbing ``pcitopo.program``. What virt-launcher does
and what we do about it (the KubeVirt sources are named in docs/SOURCES.md, "KubeVirt hook API"):
- It lists the socket folder in a loop, dials each entry (a short timeout; a failed dial is
  retried on the next pass), calls ``Info`` with a 1 s deadline and fails the VM start on an
  error. So what Info needs (opening the host model, building the server) happens before the
  socket exists, and nothing else: the hook handler is imported by the first OnDefineDomain
  (measured: importing it in the background right after binding delayed connections by
  seconds on a loaded machine, as the import holds the GIL). It is bound with its final mode
  (0660; owned by uid/gid 107 when we run as root) and the server started at once. A connection made after gRPC listens
  but before start() waits in the backlog and is answered (tested). The one residual window is
  inside gRPC's bind: the file exists a moment (measured: usually microseconds, up to ~9 ms on
  a loaded machine) before it listens; a dial landing there is refused and virt-launcher dials
  again on its next pass, so it costs a second, never an Info error. Binding under a temporary
  name and renaming would close that window but needs a temporary entry in the folder, which
  virt-launcher dials too (a failed dial of a directory costs it 2-3 s; a served socket under a
  temporary name would be recorded under that name and fail the VM later). Nothing but the
  socket is ever created there.
- A stale socket file from an earlier run (container restart) is replaced; a live one (some
  process answers on it) is left alone and we refuse to start.
- ``Info`` answers versions v1alpha3, v1alpha2, v1alpha1 and hook points ``OnDefineDomain`` and
  ``Shutdown``; ``PreCloudInitIso`` is served (input returned unchanged) but not subscribed.
- ``OnDefineDomain`` returns bytes that go raw to libvirt: never empty. A failure is a gRPC error
  whose details are one line: ``pcitopo: <kind>: <reason>``. The server keeps serving.
- ``Shutdown`` (v1alpha3), SIGTERM and SIGINT stop the server gracefully (in-flight calls
  finish) and remove the socket; the process exits 0.
- One JSON object per line on stderr for every call and lifecycle event.

The host model is opened once per process and shared by all calls (the Topology is read-only
from outside and its lazy caches only ever add entries, so concurrent readers at worst read a
sysfs file twice); ``pcitopo.serve.hooks.HostCache`` reads it again after a rebind, an IOMMU group
change or a new capture, and keeps the doctor's findings per model.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import TYPE_CHECKING, NoReturn

from pcitopo import __version__
from pcitopo.errors import ConfigError, PcitopoError, SysfsError
from pcitopo.host.sources import default_sysfs
from pcitopo.program import EXIT_OK, Parser
from pcitopo.serve import wire
from pcitopo.serve.hooks import CallFailed, Hooks, HostCache, JsonLog, elapsed_ms
from pcitopo.serve.plugin.sockets import DEFAULT_PLUGIN, NODE_HOOK_SOCKET
from pcitopo.serve.wire import VERSIONS

if TYPE_CHECKING:
    import grpc

# grpc is imported when the server is built (HookServer.start), not when this module is:
# importing this module for its helpers stays cheap. The hook handler (pcitopo.serve.core) is
# imported by the first OnDefineDomain (pcitopo.serve.hooks), which has a minute, not by Info.

DEFAULT_SOCKET = "/var/run/kubevirt-hooks/pcitopo.sock"
# virt-launcher in a non-root VMI runs as uid/gid 107 (qemu); it needs write permission on the
# socket file to connect. Nobody else needs access.
COMPUTE_UID = COMPUTE_GID = 107
SOCKET_MODE = 0o660
# The sidecar gets 200m CPU; a small pool keeps memory flat. Extra calls queue (never refused).
WORKERS = 2
# How long in-flight calls may run on when we are asked to stop.
STOP_GRACE_S = 5.0
# What the hook's output relies on from KubeVirt (docs/DEPLOY.md, "KubeVirt releases: what pcitopo relies on"), said once at start.
RELIES_ON = {
    "hook": (
        "KubeVirt v1.6 to main: virt-launcher defines the last OnDefineDomain reply as sent, and each "
        "call re-sends what its re-parse drops (v1.6-1.7: busNr and <node>); with Plugins (v1.9+) and any Plugin CR, "
        "the reply is rebuilt from KubeVirt's struct: maxphysaddr and qemu:override lost unless the pcitopo "
        "Plugin runs too (docs/DEPLOY.md, two doors)"
    ),
    "plugin": (
        "KubeVirt v1.9+ with the Plugins gate: virt-launcher defines libvirt-go-xml-module's reading of the last "
        "MutateDomain reply; on releases without kubevirt#18866 a VM with PCI hostdevs starts only if the "
        "pcitopo hook sidecar runs too (it writes the hostdevs' mode)"
    ),
    "node-hook": "KubeVirt v1.9+ with the Plugins gate: virt-handler calls PreVMStart with the VMI before the VM starts",
}


# -- the transport: raw bytes in and out -----------------------------------------------------

def _abort(context: grpc.ServicerContext, code: str, details: str) -> NoReturn:
    """End the call with a gRPC error. grpcio's ``abort`` raises; should a context's ``abort``
    ever return, we raise here anyway, so no caller goes on as if the call had succeeded."""
    import grpc

    context.abort(grpc.StatusCode[code], details)
    raise CallFailed(code, details)


def _served(context: grpc.ServicerContext, call: Callable[[], bytes]) -> bytes:
    """Run one call: a request that is not protobuf, or a CallFailed, ends it with that error."""
    try:
        return call()
    except wire.WireError as e:
        _abort(context, "INVALID_ARGUMENT", f"pcitopo: request: not a protobuf message ({e})")
    except CallFailed as e:
        _abort(context, e.code, e.details)


def _methods(hooks: Hooks, version: str) -> dict[str, Callable[[bytes], bytes]]:
    """Method name -> request bytes to response bytes, for one hook API version."""

    def on_define_domain(request: bytes) -> bytes:
        domain_xml, vmi_json = wire.on_define_domain_params(request)
        return wire.on_define_domain_result(hooks.on_define_domain(version, domain_xml, vmi_json))

    def pre_cloud_init_iso(request: bytes) -> bytes:
        out = wire.pre_cloud_init_iso_echo(request)
        hooks.pre_cloud_init_iso(version)
        return out

    def shutdown(request: bytes) -> bytes:
        wire.decode_fields(request)  # refuse a malformed request like any other
        hooks.shutdown()
        return b""  # ShutdownResult{}

    def mutate_domain(request: bytes) -> bytes:
        domain_type, domain_xml, vmi_json, context = wire.mutate_domain_request(request)
        return wire.mutate_domain_response(hooks.mutate_domain(domain_type, domain_xml, vmi_json, context))

    def execute_node_hook(request: bytes) -> bytes:
        hook_point, vmi_json, node = wire.execute_node_hook_request(request)
        hooks.execute_node_hook(hook_point, vmi_json, node)
        return b""  # ExecuteNodeHookResponse{}

    return {
        "Info": lambda request: hooks.info(),
        "OnDefineDomain": on_define_domain,
        "PreCloudInitIso": pre_cloud_init_iso,
        "Shutdown": shutdown,
        "MutateDomain": mutate_domain,
        "ExecuteNodeHook": execute_node_hook,
    }


# What each door serves on its socket: the hook sidecar's API versions, the Plugin's domain
# hook (in the VM's pod), the Plugin's node hook (on the node, for virt-handler).
DOOR_SERVICES = {
    "hook": wire.SERVICES,
    "plugin": wire.DOMAIN_HOOK_SERVICES,
    "node-hook": wire.NODE_HOOK_SERVICES,
}


def _handlers(hooks: Hooks, door: str = "hook") -> list:
    """One generic handler per service, raw bytes in and out, all delegating to ``hooks``."""
    import grpc

    def handler(method: Callable[[bytes], bytes]):
        return grpc.unary_unary_rpc_method_handler(lambda request, context: _served(context, lambda: method(request)))

    out = []
    for service, names in DOOR_SERVICES[door].items():
        methods = _methods(hooks, service.rsplit(".", 2)[-2])
        out.append((service, {name: handler(methods[name]) for name in names}))
    return out


# -- the socket ------------------------------------------------------------------------------

def clear_stale_socket(path: str) -> bool:
    """Make ``path`` free for our socket. Returns True if a stale socket was removed.

    Raises ConfigError if something we must not remove is there: a live socket (another
    server answers on it), or anything that is not a socket."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        pass  # nobody listens: stale
    except OSError as e:
        raise ConfigError(f"{path}: cannot tell whether the existing socket is live ({e.strerror or e})") from None
    else:
        raise ConfigError(f"{path}: another server is listening on this socket; refusing to replace it")
    finally:
        probe.close()
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    return True


def _same_file(path: str, ident: tuple[int, int] | None) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return ident is not None and (st.st_dev, st.st_ino) == ident


class HookServer:
    """The server's lifecycle: build, bind, open the socket, wait, stop, clean up."""

    def __init__(self, socket_path: str, sysfs: str, log: JsonLog | None = None, workers: int = WORKERS,
                 fabric: str | None = None, module_map: str | None = None, door: str = "hook", permitted=None,
                 doctor_report: str | None = None):
        self.door = door
        self.socket_path = os.path.abspath(socket_path)
        self.sysfs = sysfs
        self.log = log or JsonLog()
        self.workers = workers
        self.stop_event = threading.Event()
        self.host = HostCache(sysfs, on_reopen=lambda why: self.log("host", sysfs=sysfs, reopened=why))
        self.fabric = None
        if fabric:
            from pcitopo.paths.fabric import FabricFile

            self.fabric = FabricFile(fabric, module_map, self.host)
        doctor_file = None
        if door != "node-hook":  # the node hook has its own, in its settings (``permitted``)
            from pcitopo.serve.plugin.doctorfile import DEFAULT_DOCTOR_REPORT, DoctorFile

            doctor_file = DoctorFile(doctor_report or DEFAULT_DOCTOR_REPORT)
        self.hooks = Hooks(self.host, self.log, self.stop_event, self.fabric, permitted, doctor_file)
        self._server: grpc.Server | None = None
        self._ident: tuple[int, int] | None = None

    def _open_host_early(self) -> None:
        """Open the host model now, so a bad sysfs path shows in the log at start. A failure
        does not stop the server: every OnDefineDomain then fails (or passes through) with the
        same one-line reason, which reaches virt-launcher's log, the place an operator looks."""
        try:
            topo = self.host()
        except SysfsError as e:
            self.log("host", level="error", sysfs=self.sysfs, error=e.kind, reason=e.reason)
            return
        self.log("host", sysfs=self.sysfs, name=topo.name)
        if self.fabric is not None:  # same policy: log now, and every call says it again
            try:
                fab = self.fabric()
            except PcitopoError as e:
                self.log("fabric", level="error", path=self.fabric.path, error=e.kind, reason=e.reason)
                return
            self.log("fabric", path=fab.path, partitions=len(fab.partitions), active=[p.id for p in fab.partitions if p.active],
                     bdf_source=fab.source)

    def start(self) -> None:
        import grpc

        t0 = time.perf_counter()
        self._open_host_early()
        folder = os.path.dirname(self.socket_path)
        if not os.path.isdir(folder):
            raise ConfigError(f"socket folder {folder} does not exist (KubeVirt mounts it into the sidecar)")
        replaced = clear_stale_socket(self.socket_path)

        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="pcitopo-hook"),
            options=[
                ("grpc.max_receive_message_length", wire.MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", wire.MAX_MESSAGE_BYTES),
            ],
        )
        for service, methods in _handlers(self.hooks, self.door):
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, methods),))
            server.add_registered_method_handlers(service, methods)

        # Bind with the final mode (umask), hand the socket to the compute container's uid if
        # we are root, and start at once: gRPC listens inside add_insecure_port, and a client
        # that connects before start() waits in the backlog and is answered (tested). The
        # only moment a client can be refused is between bind() and listen() inside gRPC (see
        # the module docstring).
        old_umask = os.umask(0o777 & ~SOCKET_MODE)
        try:
            port = server.add_insecure_port(f"unix:{self.socket_path}")
        except RuntimeError as e:
            raise ConfigError(f"cannot bind {self.socket_path}: {e}") from None
        finally:
            os.umask(old_umask)
        if port == 0:
            raise ConfigError(f"cannot bind {self.socket_path}")
        if os.geteuid() == 0 and self.door != "node-hook":  # virt-handler, the node hook's client, is root
            from pcitopo.serve.plugin.sockets import hand_to

            hand_to(self.socket_path, COMPUTE_UID, COMPUTE_GID)
        server.start()
        self._server = server
        st = os.lstat(self.socket_path)
        self._ident = (st.st_dev, st.st_ino)
        self.log(
            "serving", pcitopo_version=__version__, door=self.door, socket=self.socket_path, sysfs=self.sysfs, pid=os.getpid(),
            workers=self.workers, replaced_stale_socket=replaced or None, ready_ms=elapsed_ms(t0), relies_on=RELIES_ON[self.door],
        )

    def wait(self) -> None:
        # Event.wait() without a timeout still lets Python run signal handlers in between.
        while not self.stop_event.wait(3600):
            pass

    def shutdown(self, why: str) -> None:
        """Stop accepting, let in-flight calls finish, remove the socket (only if it is still
        ours: a newer server may have replaced it)."""
        if _same_file(self.socket_path, self._ident):
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
        if self._server is not None:
            self._server.stop(STOP_GRACE_S).wait(STOP_GRACE_S + 1)
            self._server = None
        self.log("stopped", reason=why)

    def run(self) -> int:
        stop_why: list[str] = []

        def on_signal(signum, frame):  # noqa: ARG001
            stop_why.append(signal.Signals(signum).name)
            self.stop_event.set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            self.wait()
            self.shutdown(stop_why[0] if stop_why else "Shutdown call")
        finally:
            if self._server is not None:  # start() failed half-way or wait() raised
                self.shutdown("error")
            for s, h in previous.items():
                signal.signal(s, h)
        return EXIT_OK


def serve_main(argv: list[str]) -> int:
    """``pcitopo serve [--plugin NAME | --node-hook] [--socket PATH] [--sysfs PATH] [--fabric FILE
    [--module-map FILE]] [--permitted-host-devices FILE]``.
    Returns the exit code; a bad argument exits 2 with one line, an unusable socket path raises
    PcitopoError (one line, exit 2 through the CLI, which also tunes the process first:
    ``pcitopo.serve.process``)."""
    args = _serve_parser().parse_args(argv)
    ignored = _hook_version_arg(args.version)
    if ignored is None:
        from pcitopo.program import version_text

        print(version_text("pcitopo"))
        return EXIT_OK
    if args.module_map and not args.fabric:
        raise ConfigError("--module-map needs --fabric")
    door, socket_path, permitted = _door_of(args)
    server = HookServer(socket_path, args.sysfs, fabric=args.fabric, module_map=args.module_map, door=door, permitted=permitted,
                        doctor_report=args.doctor_report)
    if ignored:
        server.log("args", level="warning", ignored=f"--version {ignored}",
                   reason=f"pcitopo serves every hook API version ({', '.join(VERSIONS)}); virt-launcher picks one")
    return server.run()


def _serve_parser() -> Parser:
    parser = Parser(prog="pcitopo serve", description="Serve KubeVirt's hook API (OnDefineDomain), or the pcitopo Plugin's "
                    "domain hook (MutateDomain) or node hook (ExecuteNodeHook), on a Unix socket.")
    doors = parser.add_mutually_exclusive_group()
    doors.add_argument("--plugin", metavar="NAME", nargs="?", const=DEFAULT_PLUGIN,
                       help=f"serve the Plugin's domain hook for the Plugin named NAME (default {DEFAULT_PLUGIN}; KubeVirt "
                       "v1.9+), on /var/run/kubevirt-plugin/NAME/domain.sock unless --socket says otherwise")
    doors.add_argument("--node-hook", action="store_true", help=f"serve the Plugin's node hook (PreVMStart: the doctor's "
                       f"checks for the VM's devices), on {NODE_HOOK_SOCKET} unless --socket says otherwise")
    parser.add_argument("--socket", default=None, help=f"socket path (default {DEFAULT_SOCKET}, or the door's)")
    parser.add_argument(
        "--sysfs", default=default_sysfs(), help="sysfs root, capture .tar.gz or fixture dir (default $PCITOPO_SYSFS or /sys)"
    )
    parser.add_argument("--fabric", default=os.environ.get("PCITOPO_FABRIC") or None, metavar="FILE",
                        help="NVLink fabric partitions (`fmpm -l` output; default $PCITOPO_FABRIC), re-read when it changes")
    parser.add_argument("--module-map", default=os.environ.get("PCITOPO_MODULE_MAP") or None, metavar="FILE",
                        help='module ID -> BDF, {"gpus": [{"module", "bdf"}]}, for placeholder BDFs (default $PCITOPO_MODULE_MAP)')
    parser.add_argument("--permitted-host-devices", default=os.environ.get("PCITOPO_KUBEVIRT_CR") or None, metavar="FILE",
                        help="--node-hook: the KubeVirt CR (YAML or JSON), whose permittedHostDevices map a VM's GPU and host "
                        "device resource names to vendor:device (default $PCITOPO_KUBEVIRT_CR; without it: every "
                        "vfio-pci GPU and NIC of the node)")
    parser.add_argument("--doctor-report", default=os.environ.get("PCITOPO_DOCTOR_REPORT") or None, metavar="FILE",
                        help="what `pcitopo doctor --json-out FILE` wrote (default $PCITOPO_DOCTOR_REPORT or "
                        "/var/run/pcitopo/doctor.json), for the checks an unprivileged hook cannot make (ACS, ATS); missing or "
                        "stale: they stay unknown, and pcitopo.kubevirt.io/doctor: require refuses the VM")
    parser.add_argument(
        "--version", nargs="?", const="", metavar="HOOK_API_VERSION",
        help="alone: print pcitopo's version; with a hook API version (KubeVirt's example sidecars pass "
        "`--version v1alpha2`): accepted and ignored, pcitopo serves v1alpha1, v1alpha2 and v1alpha3",
    )
    return parser


def _door_of(args) -> tuple[str, str, object]:
    """(door, socket path, permitted host devices) from the arguments; a socket KubeVirt would
    never dial is a one-line error before anything binds."""
    from pcitopo.serve.plugin import sockets

    if args.permitted_host_devices and not args.node_hook:
        raise ConfigError("--permitted-host-devices is for --node-hook")
    if args.plugin is not None:
        path = args.socket or sockets.domain_socket(args.plugin)
        sockets.check_domain_socket(path, args.plugin)
        return "plugin", path, None
    if args.node_hook:
        from pcitopo.serve.plugin.nodehook import node_settings

        return "node-hook", args.socket or sockets.NODE_HOOK_SOCKET, node_settings(args.permitted_host_devices, args.doctor_report)
    return "hook", args.socket or DEFAULT_SOCKET, None


def _hook_version_arg(value: str | None) -> str | None:
    """``serve --version``: None to print our version, "" when absent, the
    hook API version when one is named (accepted, ignored); anything else is a one-line error."""
    if value == "":
        return None
    if value is None:
        return ""
    if value not in VERSIONS:
        raise ConfigError(f"--version {value[:40]}: not a hook API version ({', '.join(VERSIONS)}); "
                          f"pcitopo serves all of them, so the argument can be dropped")
    return value
