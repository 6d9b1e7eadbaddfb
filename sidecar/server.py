"""``pcitopo serve``: KubeVirt's hook API over a Unix socket (gRPC), a thin door around
:func:`sidecar.core.handle_define_domain`.

What virt-launcher does and what we do about it (``shared/brief/01-kubevirt-hooks.md``):
- It lists the socket folder every few hundred ms, dials each entry (2 s, retrying), calls
  ``Info`` with a 1 s deadline and panics on an error. So everything slow (imports, opening the
  host model, building the server) happens before the socket exists; then it is bound with its
  final mode (0660; owned by uid/gid 107 when we run as root) and the server started at once.
  A connection made after gRPC listens but before start() waits in the backlog and is answered
  (tested). The one residual window is inside gRPC's bind: the file exists a moment (measured:
  usually microseconds, up to ~9 ms on a loaded machine) before it listens; a dial landing
  there is refused and virt-launcher's dial retries (~1 s later, within its 2 s), so it costs a
  second, never an Info error. Binding under a temporary name and renaming would close that
  window but needs a temporary entry in the folder, which virt-launcher dials too (a failed
  dial of a directory costs it 2-3 s; a served socket under a temporary name would be recorded
  under that name and fail the VM later). Nothing but the socket is ever created there.
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
sysfs file twice).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import stat
import sys
import threading
import time
from concurrent import futures
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable

from topology.errors import ConfigError, PcitopoError, SysfsError
from topology.model import Topology
from topology.sysfs import default_sysfs, open_host

from . import core
from .config import parse_vmi
from .hookproto import INFO_NAME, ON_DEFINE_DOMAIN, SHUTDOWN, VERSIONS

if TYPE_CHECKING:
    import grpc

# grpc is imported when the server is built (HookServer.start), not when this module is: `pcitopo serve` first keeps OpenSSL out of the process (see
# keep_openssl_out), and importing this module for its helpers stays cheap.

DEFAULT_SOCKET = "/var/run/kubevirt-hooks/pcitopo.sock"
# virt-launcher in a non-root VMI runs as uid/gid 107 (qemu); it needs write permission on the
# socket file to connect. Nobody else needs access.
COMPUTE_UID = COMPUTE_GID = 107
SOCKET_MODE = 0o660
# A KubeVirt domain is tens of KB and a VMI JSON a few KB; gRPC's own default (4 MiB) would do,
# but say it here so it is a decision: larger requests are refused by gRPC before they reach us.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
# The sidecar gets 200m CPU; a small pool keeps memory flat. Extra calls queue (never refused).
WORKERS = 2
# How long in-flight calls may run on when we are asked to stop.
STOP_GRACE_S = 5.0

EXIT_OK, EXIT_BAD_INPUT = 0, 2


# -- logging ---------------------------------------------------------------------------------

class JsonLog:
    """One JSON object per line on a text stream; safe across threads."""

    def __init__(self, stream=None):
        self._stream = stream if stream is not None else sys.stderr
        self._lock = threading.Lock()

    def __call__(self, event: str, level: str = "info", **fields: Any) -> None:
        now = datetime.now(timezone.utc)
        rec = {"ts": now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z", "level": level, "event": event}
        rec.update({k: v for k, v in fields.items() if v is not None})
        line = json.dumps(rec, separators=(",", ":"), default=str)
        with self._lock:
            try:
                self._stream.write(line + "\n")
                self._stream.flush()
            except (OSError, ValueError):
                pass  # a closed stderr must not fail a call


# -- the host model, opened once ---------------------------------------------------------

class HostCache:
    """Opens the host model once and shares it; an error is retried on the next call (the
    caller gets the same one-line SysfsError until the path becomes readable)."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self._topology: Topology | None = None

    def __call__(self) -> Topology:
        topo = self._topology
        if topo is not None:
            return topo
        with self._lock:
            if self._topology is None:
                self._topology = open_host(self.path)
            return self._topology


# -- the calls -------------------------------------------------------------------------------

_GRPC_CODE = {
    "config": "INVALID_ARGUMENT",
    "vmi": "INVALID_ARGUMENT",
    "domain": "INVALID_ARGUMENT",
    "unknown-device": "FAILED_PRECONDITION",
    "sysfs": "FAILED_PRECONDITION",
    "plan": "FAILED_PRECONDITION",
    "doctor": "FAILED_PRECONDITION",  # pcitopo doctor (issue 13): doctor: require and a check failed
    "internal": "INTERNAL",
}


def grpc_code(err: PcitopoError) -> grpc.StatusCode:
    import grpc

    return grpc.StatusCode[_GRPC_CODE.get(err.kind, "UNKNOWN")]


def error_details(err: PcitopoError) -> str:
    """The gRPC status details: one line, prefixed so virt-launcher's log names us."""
    return f"pcitopo: {err.kind}: {err.reason}"


class Hooks:
    """What every version's servicer calls; owns the call counter, the log and the stop event."""

    def __init__(self, host: Callable[[], Topology], log: JsonLog, stop: threading.Event):
        self.host = host
        self.log = log
        self.stop = stop
        self._calls = 0
        self._lock = threading.Lock()

    def info(self) -> bytes:
        self.log("Info", versions=list(VERSIONS))
        return INFO_RESULT

    def on_define_domain(self, version: str, domain_xml: bytes, vmi_json: bytes, context: grpc.ServicerContext) -> bytes:
        with self._lock:
            self._calls += 1
            call = self._calls
        t0 = time.perf_counter()
        try:
            out = core.handle_define_domain(domain_xml, vmi_json, self.host)
        except PcitopoError as e:
            self.log(
                ON_DEFINE_DOMAIN, level="error", version=version, vmi=_vmi_ref(vmi_json), call=call,
                outcome="failed", error=e.kind, reason=e.reason, duration_ms=_ms(t0),
            )
            context.abort(grpc_code(e), error_details(e))
        except Exception as e:  # core wraps bugs already; this is the door's last line of defence
            import grpc

            self.log(ON_DEFINE_DOMAIN, level="error", version=version, call=call, outcome="failed", error="internal", reason=f"{type(e).__name__}: {e}", duration_ms=_ms(t0))
            context.abort(grpc.StatusCode.INTERNAL, f"pcitopo: internal: {type(e).__name__}: {' '.join(str(e).split())}")
        self.log(
            ON_DEFINE_DOMAIN, level="warning" if out.outcome == "passthrough" else "info", version=version,
            vmi=out.vmi.ref, call=call, outcome=out.outcome, reason=out.reason, duration_ms=_ms(t0),
            in_bytes=len(domain_xml), out_bytes=len(out.xml), **out.summary,
        )
        return out.xml

    def pre_cloud_init_iso(self, version: str) -> None:
        self.log("PreCloudInitIso", version=version, outcome="unchanged")

    def shutdown(self) -> None:
        self.log(SHUTDOWN, reason="virt-launcher asked us to stop")
        self.stop.set()


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 2)


def _vmi_ref(vmi_json: bytes) -> str:
    try:
        return parse_vmi(vmi_json).ref
    except PcitopoError:
        return "-/-"


# -- the wire format ---------------------------------------------------------------------------
#
# Every hook message is flat: bytes/string fields, plus InfoResult's repeated HookPoint. The
# server reads and writes them itself, in the proto3 wire format protobuf would produce
# (tag varint, length varint, bytes; empty fields omitted), instead of through protobuf's
# runtime, which would cost the sidecar ~3 MiB of resident memory and ~30 ms of start-up
# (bench/perf.py). The generated code in sidecar/hookproto stays the reference: clients and
# tests (tests/sidecar) speak to this server only through it.

# Service -> its methods, as virt-launcher dials them (/<service>/<method>; brief 01).
SERVICES = {
    "kubevirt.hooks.info.Info": ("Info",),
    "kubevirt.hooks.v1alpha1.Callbacks": ("OnDefineDomain",),
    "kubevirt.hooks.v1alpha2.Callbacks": ("OnDefineDomain", "PreCloudInitIso"),
    "kubevirt.hooks.v1alpha3.Callbacks": ("OnDefineDomain", "PreCloudInitIso", "Shutdown"),
}
# Field numbers (KubeVirt's .proto files, proto/sidecar/hookproto/*.proto).
DOMAIN_XML, VMI = 1, 2  # OnDefineDomainParams; OnDefineDomainResult.domainXML = 1
CLOUD_INIT_NOCLOUD_SOURCE, CLOUD_INIT_DATA = 1, 3  # PreCloudInitIsoParams/Result
_LEN = 2  # wire type of bytes, strings and messages


class WireError(ValueError):
    """A request that is not a well-formed protobuf message."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf):
            raise WireError("truncated varint")
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than 10 bytes")


def encode_fields(fields: list[tuple[int, bytes]]) -> bytes:
    """A message of length-delimited fields, in the order given; empty values are omitted
    (proto3 does not write fields at their default)."""
    out = bytearray()
    for number, value in fields:
        if value:
            out += _varint(number << 3 | _LEN)
            out += _varint(len(value))
            out += value
    return bytes(out)


def decode_fields(buf: bytes) -> dict[int, bytes]:
    """Field number -> value of every top-level length-delimited field (the last one when a
    number comes twice, as proto3 parses singular fields); other fields (varints, fixed, and
    groups) are skipped, as protobuf skips unknown fields. Raises WireError where protobuf's
    parser would fail."""
    out: dict[int, bytes] = {}
    _scan(buf, 0, out, None, 0)
    return out


def _scan(buf: bytes, i: int, out: dict[int, bytes] | None, group: int | None, depth: int) -> int:
    """Read fields from ``i`` to the end (or to the end of ``group``); returns the new offset."""
    n = len(buf)
    while i < n:
        key, i = _read_varint(buf, i)
        number, wire_type = key >> 3, key & 7
        if not 0 < number <= 0x1FFFFFFF or key > 0xFFFFFFFF:
            raise WireError(f"field number {number} out of range")
        if wire_type == 0:
            _, i = _read_varint(buf, i)
        elif wire_type == 1:
            i += 8
        elif wire_type == 5:
            i += 4
        elif wire_type == _LEN:
            size, i = _read_varint(buf, i)
            if size > n - i:
                raise WireError("truncated field")
            if out is not None:
                out[number] = buf[i:i + size]
            i += size
        elif wire_type == 3:  # a (deprecated) group: skip to its end
            if depth >= 100:
                raise WireError("groups nested too deeply")
            i = _scan(buf, i, None, number, depth + 1)
        elif wire_type == 4 and number == group:
            return i
        else:
            raise WireError(f"unexpected wire type {wire_type}")
        if i > n:
            raise WireError("truncated field")
    if group is not None:
        raise WireError("unterminated group")
    return i


# InfoResult{name = 1; repeated HookPoint hookPoints = 3; repeated string versions = 4}, with
# HookPoint{name = 1; priority = 2} (priority 0 is not written): the same bytes every time.
INFO_RESULT = encode_fields(
    [(1, INFO_NAME.encode())]
    + [(3, encode_fields([(1, name.encode())])) for name in (ON_DEFINE_DOMAIN, SHUTDOWN)]
    + [(4, v.encode()) for v in VERSIONS]
)


def _handlers(hooks: Hooks) -> list:
    """One generic handler per service, raw bytes in and out, all delegating to ``hooks``."""
    import grpc

    def fields(request: bytes, context: grpc.ServicerContext) -> dict[int, bytes]:
        try:
            return decode_fields(request)
        except WireError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"pcitopo: request: not a protobuf message ({e})")

    def info(request: bytes, context: grpc.ServicerContext) -> bytes:
        return hooks.info()

    def on_define_domain(version: str) -> Callable:
        def call(request: bytes, context: grpc.ServicerContext) -> bytes:
            f = fields(request, context)
            out = hooks.on_define_domain(version, f.get(DOMAIN_XML, b""), f.get(VMI, b""), context)
            return encode_fields([(DOMAIN_XML, out)])
        return call

    def pre_cloud_init_iso(version: str) -> Callable:
        def call(request: bytes, context: grpc.ServicerContext) -> bytes:
            f = fields(request, context)
            hooks.pre_cloud_init_iso(version)
            return encode_fields([(n, f.get(n, b"")) for n in (CLOUD_INIT_NOCLOUD_SOURCE, CLOUD_INIT_DATA)])
        return call

    def shutdown(request: bytes, context: grpc.ServicerContext) -> bytes:
        fields(request, context)
        hooks.shutdown()
        return b""  # ShutdownResult{}

    out = []
    for service, methods in SERVICES.items():
        version = service.split(".")[2]
        impl = {
            "Info": info,
            "OnDefineDomain": on_define_domain(version),
            "PreCloudInitIso": pre_cloud_init_iso(version),
            "Shutdown": shutdown,
        }
        out.append((service, {m: grpc.unary_unary_rpc_method_handler(impl[m]) for m in methods}))
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
    """The server's lifecycle: build, bind, open the door, wait, stop, clean up."""

    def __init__(self, socket_path: str, sysfs: str, log: JsonLog | None = None, workers: int = WORKERS):
        self.socket_path = os.path.abspath(socket_path)
        self.sysfs = sysfs
        self.log = log or JsonLog()
        self.workers = workers
        self.stop_event = threading.Event()
        self.host = HostCache(sysfs)
        self.hooks = Hooks(self.host, self.log, self.stop_event)
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
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        for service, methods in _handlers(self.hooks):
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
        if os.geteuid() == 0:
            os.chown(self.socket_path, COMPUTE_UID, COMPUTE_GID)
        server.start()
        self._server = server
        st = os.lstat(self.socket_path)
        self._ident = (st.st_dev, st.st_ino)
        self.log(
            "serving", socket=self.socket_path, sysfs=self.sysfs, pid=os.getpid(), workers=self.workers,
            replaced_stale_socket=replaced or None, ready_ms=_ms(t0),
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


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise ConfigError(f"{self.prog}: {message}")


# Standard-library modules that load OpenSSL (libssl/libcrypto: ~4 MiB resident, measured with
# bench/perf.py) and that the server never needs: it serves plain gRPC on a Unix socket (grpcio
# carries its own TLS, BoringSSL, unused here), and hashlib and hmac fall back to Python's
# built-in hashes without _hashlib. asyncio (which grpcio imports) and hmac (which pydantic
# imports) import them only inside try/except ImportError.
OPENSSL_MODULES = ("ssl", "_ssl", "_hashlib")


def keep_openssl_out() -> None:
    """Make ``import ssl`` (and _ssl, _hashlib) raise ImportError in this process, unless
    already imported. Only ``pcitopo serve`` calls this, before anything imports grpc; a
    library user's process is left alone."""
    for name in OPENSSL_MODULES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def limit_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives every thread that allocates its own malloc arena (up to 8 per core): with
    gRPC's threads and the worker pool, freed memory then sits in many arenas. Capping them
    keeps resident memory flat under concurrent calls (measured: bench/perf.py, bench/load.py).
    Must run before the threads exist; a no-op where the C library is not glibc or the
    operator already set MALLOC_ARENA_MAX."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(-8, arenas)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


def serve_main(argv: list[str]) -> int:
    """``pcitopo serve [--socket PATH] [--sysfs PATH]``. Returns the exit code; a bad argument
    or an unusable socket path raises PcitopoError (one line, exit 2 through the CLI door)."""
    keep_openssl_out()
    limit_malloc_arenas()
    parser = _Parser(prog="pcitopo serve", description="Serve KubeVirt's hook API (OnDefineDomain) on a Unix socket.")
    parser.add_argument("--socket", default=DEFAULT_SOCKET, help=f"socket path (default {DEFAULT_SOCKET})")
    parser.add_argument(
        "--sysfs", default=default_sysfs(), help="sysfs root, capture .tar.gz or fixture dir (default $PCITOPO_SYSFS or /sys)"
    )
    args = parser.parse_args(argv)
    return HookServer(args.socket, args.sysfs).run()


def main() -> None:  # python -m sidecar.server
    try:
        rc = serve_main(sys.argv[1:])
    except PcitopoError as e:
        print(f"pcitopo serve: {e}", file=sys.stderr)
        rc = EXIT_BAD_INPUT
    sys.exit(rc)


if __name__ == "__main__":
    main()
