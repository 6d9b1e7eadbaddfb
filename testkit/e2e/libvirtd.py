"""A private, throw-away libvirtd for the e2e tier, run from a chosen stack.

The stack (``testkit.stack``) is, by default, the Debian 13 root ``make setup`` builds under
``.cache/trixie/root`` (QEMU 10.0, libvirt 11.3, SeaBIOS 1.16.3, OVMF 2025.02: what KubeVirt's
users boot on); :data:`testkit.stack.DEBIAN12` is the machine's own (QEMU 7.2, libvirt 9.0).

Run as root, the monolithic ``libvirtd`` is "privileged": its QEMU driver reads
``/etc/libvirt/qemu.conf`` and keeps state in ``/run/libvirt``, ``/var/lib/libvirt``,
``/var/cache/libvirt`` and ``/var/log/libvirt``; those paths are compiled in (the XDG
variables only apply to an unprivileged session daemon). To keep every byte of that private
we start libvirtd inside its own mount and network namespace (``unshare -m -n``, propagation
private) and bind-mount directories of ours over those five paths. For the Debian 13 root, the
same namespace also binds ``/dev``, ``/proc``, ``/sys`` and the directories the domains name
(the e2e cache with kernel, initramfs and serial logs; the daemon's base; the temp dir) into the
root at their own paths, then ``exec chroot ROOT libvirtd``; QEMU inherits root and namespace,
so ``/usr/share/ovmf/OVMF.fd`` and QEMU's default BIOS are the root's. So:

- nothing of a system libvirtd (if any) is read, written or connected to;
- no mount is ever visible outside the namespace, and none needs unmounting: the kernel drops
  them when its last process (libvirtd and its QEMUs) exits. A recursive delete of the root from
  outside cannot walk into a bound directory;
- the guest has no route anywhere (the namespace has only a down loopback;
  user-mode networking of stand-in NICs stays inside QEMU);
- the daemon's sockets live in ``<base>/sock`` (``unix_sock_dir``), visible
  from outside the namespace at the same path; :meth:`PrivateLibvirtd.virsh` runs the stack's
  own ``virsh`` (for the root: ``nsenter`` into the daemon's mount namespace and root).

The only traces outside ``<base>`` are the empty mount-point directories
(``/run/libvirt`` ... on the machine for Debian 12; the shared paths inside the root for Debian
13) and, for Debian 12, the ``libvirt-qemu`` user/group (libvirt's QEMU driver refuses to start
without them; scripts/setup-debian.sh creates them, we do too if missing; the root has its own).

The daemon is stopped by its own PID (SIGTERM, then SIGKILL), and any QEMU it
left behind by the PID in its pid file. QEMU's capability probe (~4-10 s) is
cached across runs in ``.cache/e2e/libvirt-capcache-<stack>``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from itertools import count
from pathlib import Path

from testkit.stack import Stack, StackVersions

from .paths import cache_dir, e2e_stack

QEMU_CONF = """\
# private qemu.conf of the pcitopo e2e tier
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
stdio_handler = "file"
namespaces = [ ]
cgroup_controllers = [ ]
security_driver = "none"
"""

# The directories libvirtd (privileged) uses, and our names for them.
_BINDS = (
    ("etc", "/etc/libvirt"),
    ("run", "/run/libvirt"),
    ("lib", "/var/lib/libvirt"),
    ("cache", "/var/cache/libvirt"),
    ("log", "/var/log/libvirt"),
)


class LibvirtError(RuntimeError):
    pass


def ensure_libvirt_qemu_user() -> None:
    import grp
    import pwd

    try:
        grp.getgrnam("libvirt-qemu")
    except KeyError:
        subprocess.run(["groupadd", "--system", "libvirt-qemu"], check=True, timeout=30)
    try:
        pwd.getpwnam("libvirt-qemu")
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--gid", "libvirt-qemu", "--home-dir",
             "/var/lib/libvirt", "--no-create-home", "--shell", "/usr/sbin/nologin",
             "libvirt-qemu"],
            check=True, timeout=30,
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours counts as dead
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _remove_stale_bases() -> None:
    """Drop ``.cache/e2e/libvirt-<pid>[-<n>]`` dirs of processes that are gone."""
    for d in cache_dir().glob("libvirt-[0-9]*"):
        try:
            pid = int(d.name.split("-")[1])
        except ValueError:
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            shutil.rmtree(d, ignore_errors=True)


_bases = count()


class PrivateLibvirtd:
    """Usage::

        with PrivateLibvirtd() as lv:          # Debian 13 root (or $PCITOPO_E2E_STACK)
            lv.virsh("define", "dom.xml")
        PrivateLibvirtd(stack=DEBIAN12)         # the machine's own libvirt 9 / QEMU 7.2
    """

    def __init__(
        self, base: Path | None = None, start_timeout: float = 60.0, idle_timeout: float = 900.0,
        stack: Stack | None = None,
    ) -> None:
        self.start_timeout = start_timeout
        # safety net if our process dies without stop(): libvirtd exits by
        # itself after this long with no client and no running domain
        self.idle_timeout = idle_timeout
        self.stack = stack if stack is not None else e2e_stack()
        if base is None:
            base = cache_dir() / f"libvirt-{os.getpid()}-{next(_bases)}"
            # sun_path is 108 bytes; keep well clear of it
            if len(str(base / "sock" / "libvirt-sock")) > 100:
                base = Path(tempfile.mkdtemp(prefix="pcitopo-lv-"))
        self.base = base.resolve()
        self.proc: subprocess.Popen | None = None
        self.capcache = cache_dir() / f"libvirt-capcache-{self.stack.name}"

    # -- paths -------------------------------------------------------------
    @property
    def socket(self) -> Path:
        return self.base / "sock" / "libvirt-sock"

    @property
    def uri(self) -> str:
        return f"qemu:///system?socket={self.socket}"

    @property
    def daemon_log(self) -> Path:
        return self.base / "libvirtd.log"

    def qemu_log(self, name: str) -> Path:
        return self.base / "log" / "qemu" / f"{name}.log"

    def qemu_pidfile(self, name: str) -> Path:
        return self.base / "run" / "qemu" / f"{name}.pid"

    def shared_dirs(self) -> list[Path]:
        """Directories a domain's paths point into (kernel, initramfs, serial log, XML to
        define), bound into a separate root at their own paths: the e2e cache, the daemon's base
        and the temp dir (pytest's ``tmp_path``). Parents before children."""
        dirs = {cache_dir().resolve(), self.base, Path(tempfile.gettempdir()).resolve()}
        return sorted(dirs, key=lambda d: (len(d.parts), str(d)))

    def versions(self) -> StackVersions:
        """What this daemon's stack carries (QEMU, libvirt, SeaBIOS, OVMF): every boot table
        prints it, ``.line()`` in full or ``.short()``."""
        return self.stack.versions()

    # -- lifecycle ---------------------------------------------------------
    def _check_tools(self) -> None:
        if self.stack.root is None:
            for tool in ("libvirtd", "virsh", "unshare", "qemu-system-x86_64"):
                if shutil.which(tool) is None:
                    raise LibvirtError(f"{tool} not found: run `bash scripts/setup-debian.sh`")
            ensure_libvirt_qemu_user()
            return
        for tool in ("unshare", "nsenter", "chroot"):
            if shutil.which(tool) is None:
                raise LibvirtError(f"{tool} not found (util-linux, coreutils)")
        for tool in ("/usr/sbin/libvirtd", "/usr/bin/virsh", "/usr/bin/qemu-system-x86_64"):
            if not self.stack.path(tool).exists():
                raise LibvirtError(f"{self.stack.path(tool)} missing: run `bash scripts/setup-trixie.sh`")

    def _mount_script(self) -> str:
        """Shell lines, run inside the new mount namespace, that give libvirtd its directories
        (and, for a separate root, the machine's /dev, /proc, /sys and the shared dirs)."""
        root = self.stack.root
        lines = []
        if root is not None:
            # rbind: /dev/pts, /dev/shm and the cgroup mounts below /sys come along
            lines += [f"mount --rbind /dev '{root}/dev'", f"mount --bind /proc '{root}/proc'",
                      f"mount --rbind /sys '{root}/sys'"]
            for d in self.shared_dirs():
                # non-recursive on purpose: a root that lies below a shared dir shows up inside
                # as a plain directory, never as a loop of mounts
                lines += [f"mkdir -p '{root}{d}'", f"mount --bind '{d}' '{root}{d}'"]
        for sub, target in _BINDS:
            if root is None:
                os.makedirs(target, exist_ok=True)  # mount point only
                lines.append(f"mount --bind '{self.base / sub}' '{target}'")
            else:
                lines += [f"mkdir -p '{root}{target}'", f"mount --bind '{self.base / sub}' '{root}{target}'"]
        return "\n".join(lines)

    def _write_config(self) -> None:
        if self.capcache.is_dir():
            shutil.copytree(self.capcache, self.base / "cache", dirs_exist_ok=True)
        (self.base / "etc" / "qemu.conf").write_text(QEMU_CONF)
        (self.base / "etc" / "libvirtd.conf").write_text(
            f'unix_sock_dir = "{self.base / "sock"}"\n'
            'unix_sock_group = "root"\n'
            'unix_sock_ro_perms = "0700"\n'
            'unix_sock_rw_perms = "0700"\n'
            'unix_sock_admin_perms = "0700"\n'
            'auth_unix_ro = "none"\n'
            'auth_unix_rw = "none"\n'
            f'log_outputs = "3:file:{self.daemon_log}"\n'
        )

    def start(self) -> None:
        if self.proc is not None:
            return
        self._check_tools()
        _remove_stale_bases()
        if self.base.exists():
            shutil.rmtree(self.base)
        for sub, _ in _BINDS:
            (self.base / sub).mkdir(parents=True)
        (self.base / "sock").mkdir()
        self._write_config()
        chroot = "" if self.stack.root is None else f"chroot '{self.stack.root}' "
        script = (
            "set -e\n"
            + self._mount_script()
            + f"\nexec {chroot}libvirtd --config /etc/libvirt/libvirtd.conf"
            " --pid-file /run/libvirt/libvirtd.pid"
            f" --timeout {int(self.idle_timeout)}\n"
        )
        (self.base / "start.sh").write_text(script)
        out = open(self.base / "libvirtd.stdout", "wb")
        # the PID stays libvirtd's: unshare, sh and chroot each exec the next
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--net", "--propagation", "private",
             "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise LibvirtError(
                    f"libvirtd ({self.stack.label}) exited with {self.proc.returncode}: "
                    + (self.base / "libvirtd.stdout").read_text(errors="replace")[-2000:]
                )
            if self.socket.exists():
                r = self.virsh("version", check=False, timeout=max(5.0, deadline - time.monotonic()))
                if r.returncode == 0:
                    break
            if time.monotonic() > deadline:
                self.stop()
                raise LibvirtError(f"libvirtd did not answer within {self.start_timeout}s")
            time.sleep(0.1)

    def _leftover_qemu_pids(self) -> list[int]:
        pids = []
        for pf in (self.base / "run" / "qemu").glob("*.pid"):
            try:
                pid = int(pf.read_text().strip())
            except (OSError, ValueError):
                continue
            try:
                exe = os.readlink(f"/proc/{pid}/exe")
            except OSError:
                continue
            if "qemu-system" in exe:
                pids.append(pid)
        return pids

    def stop(self) -> None:
        if self.proc is None:
            return
        # domains first, while the daemon can still do it cleanly
        if self.proc.poll() is None:
            r = self.virsh("list", "--name", check=False, timeout=10)
            for name in r.stdout.split():
                self.virsh("destroy", name, check=False, timeout=20)
        for pid in self._leftover_qemu_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pid = self.proc.pid
        if self.proc.poll() is None:
            os.kill(pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)
                self.proc.wait(timeout=15)
        self.proc = None
        self._save_capcache()

    def _save_capcache(self) -> None:
        src = self.base / "cache" / "qemu" / "capabilities"
        if not src.is_dir():
            return
        dst = self.capcache / "qemu" / "capabilities"
        dst.mkdir(parents=True, exist_ok=True)
        for f in src.glob("*.xml"):
            tmp = dst / f".{f.name}.{os.getpid()}"
            shutil.copyfile(f, tmp)
            tmp.replace(dst / f.name)

    def cleanup(self, keep_logs: bool = False) -> None:
        """Remove the private base dir (after stop)."""
        if self.proc is not None:
            self.stop()
        if not keep_logs and self.base.exists():
            shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> PrivateLibvirtd:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- virsh -------------------------------------------------------------
    def virsh_argv(self) -> list[str]:
        """The stack's own virsh: for a separate root, entered through the running daemon's
        mount namespace and root directory (the socket and shared dirs exist only there)."""
        if self.stack.root is None:
            return ["virsh"]
        if self.proc is None:
            raise LibvirtError("libvirtd is not running")
        return ["nsenter", f"--target={self.proc.pid}", "--mount", "--root", "--wd", "virsh"]

    def virsh(
        self, *args: str, check: bool = True, timeout: float = 60.0, input: bytes | None = None
    ) -> subprocess.CompletedProcess:
        cmd = [*self.virsh_argv(), "--quiet", "-c", self.uri, *args]
        try:
            r = subprocess.run(
                cmd, input=input, capture_output=True, timeout=timeout,
                env={**os.environ, "LC_ALL": "C", "LIBVIRT_DEFAULT_URI": self.uri},
            )
        except subprocess.TimeoutExpired as e:
            raise LibvirtError(f"virsh {' '.join(args)}: no answer within {timeout}s") from e
        r = subprocess.CompletedProcess(
            r.args, r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
        )
        if check and r.returncode != 0:
            raise LibvirtError(f"virsh {' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
        return r
