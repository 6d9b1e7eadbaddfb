"""The sidecar server under test as a child process: started, talked to, and stopped by its own
PID (never by name: the machine is shared). One helper for the sidecar tests, the hostile
corpus, ``bench/load.py`` and ``bench/perf.py``.

- :class:`ServerProcess`: any argv (usually :func:`serve_argv`), output to a log file, and the
  socket it serves on wherever the caller put it (a KubeVirt-like ``hook-sidecar-0/`` folder);
- :class:`PrivateServer`: ``pcitopo serve`` on a socket in a short private ``/tmp`` folder
  (AF_UNIX paths are limited to 108 bytes), removed with the server.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import REPO

# The project's console scripts, as `make setup` installs them (pip install -e) next to python.
BIN = Path(sys.executable).parent


def serve_argv(socket_path: str | Path, sysfs: str | Path, program: Sequence[str] | None = None) -> list[str]:
    """``pcitopo serve`` (the console script the container's ENTRYPOINT runs) on a socket and host."""
    return [*(program or [str(BIN / "pcitopo"), "serve"]), "--socket", str(socket_path), "--sysfs", str(sysfs)]


def _listening(path: str | Path) -> bool:
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def wait_for_socket(path: str | Path, timeout: float = 10.0, proc: subprocess.Popen | None = None) -> None:
    """Until something listens on the socket; an AssertionError if ``proc`` exits first or time
    runs out. A file at ``path`` is not enough: a stale socket left by a killed server exists
    before the new server has replaced it, and dialling it then times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path) and _listening(path):
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode} before creating {path}")
        time.sleep(0.01)
    raise AssertionError(f"{path} did not appear within {timeout}s")


class ServerProcess:
    """``argv`` as a child process, stdout and stderr in ``log_path``, stopped by its own PID.

    ``env`` is the child's whole environment (default: ours); ``socket`` is where it serves,
    for :meth:`wait_for_socket`, :meth:`info` and :meth:`define`."""

    def __init__(self, argv: Sequence[str], log_path: str | Path, env: Mapping[str, str] | None = None,
                 cwd: str | Path | None = None, socket: str | Path | None = None):
        self.log_path = Path(log_path)
        self.socket = Path(socket) if socket is not None else None
        self._log = open(self.log_path, "wb")
        self.t_exec = time.perf_counter()
        self.proc = subprocess.Popen(list(argv), stdout=self._log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ if env is None else env), cwd=cwd or REPO)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def target(self) -> str:
        """The gRPC target of the socket."""
        return f"unix:{self.socket}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_lines(self) -> list[dict]:
        """The log, one JSON object per line (a line that is not JSON comes as ``{"raw": line}``)."""
        out = []
        for line in self.log_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"raw": line})
        return out

    def wait_for_socket(self, timeout: float = 60.0) -> None:
        assert self.socket is not None, "this server was started without a known socket"
        try:
            wait_for_socket(self.socket, timeout, self.proc)
        except AssertionError as e:
            raise AssertionError(f"{e}; log: {self.log_text()[-2000:]}") from None

    def channel(self):
        import grpc

        return grpc.insecure_channel(self.target, options=[("grpc.max_send_message_length", -1)])

    def info(self, timeout: float = 5.0):
        """Info on a new connection."""
        from testkit.hookproto import info_pb2, info_pb2_grpc

        with self.channel() as ch:
            return info_pb2_grpc.InfoStub(ch).Info(info_pb2.InfoParams(), timeout=timeout)

    def define(self, domain: bytes, vmi: bytes = b"", timeout: float = 60.0) -> bytes:
        """OnDefineDomain (v1alpha3) on a new connection, as virt-launcher makes every call."""
        from testkit.hookproto import v1alpha3_pb2, v1alpha3_pb2_grpc

        with self.channel() as ch:
            stub = v1alpha3_pb2_grpc.CallbacksStub(ch)
            return stub.OnDefineDomain(v1alpha3_pb2.OnDefineDomainParams(domainXML=domain, vmi=vmi), timeout=timeout).domainXML

    def wait(self, timeout: float = 10.0) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not go (both by PID)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class PrivateServer(ServerProcess):
    """``pcitopo serve`` on ``<private /tmp folder>/pcitopo.sock``; the folder goes with :meth:`stop`."""

    def __init__(self, sysfs: str | Path, env: Mapping[str, str] | None = None,
                 program: Sequence[str] | None = None, prefix: str = "pcitopo-"):
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        sock = self.dir / "pcitopo.sock"
        try:
            super().__init__(serve_argv(sock, sysfs, program), self.dir / "server.log", env=env, socket=sock)
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.dir, ignore_errors=True)
