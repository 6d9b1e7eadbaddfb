"""Where a Plugin's sockets live, and the rules KubeVirt holds them to.

The domain hook's socket is dialled by virt-launcher inside the VM's pod. KubeVirt v1.9.0
(``validateSocketPath``, ``pkg/virt-launcher/virtwrap/plugins/sidecar.go``) accepts only a clean
absolute path under ``/var/run/kubevirt-plugin/<plugin name>/`` that ends in ``.sock``, fits a
Unix socket address (108 bytes) and is not itself a symlink; the folder is an emptyDir shared with
the compute container, which the sidecar mounts with ``subPath: <plugin name>``. A server that
binds anywhere else would never be called: we refuse to start there instead.

The node hook's socket is dialled by virt-handler, in its own container, with the path the
Plugin CR names, verbatim (``pkg/virt-handler/plugins/manager.go`` ``executeHook``; nothing
validates that path). virt-handler mounts the host's ``/var/run/kubevirt`` (virt-share-dir);
KubeVirt's own end-to-end tests put node-hook sockets under ``/var/run/kubevirt/plugins/`` on the
host. Ours sits in a folder of its own there, ``/var/run/kubevirt/plugins/pcitopo/``, which is all
the DaemonSet mounts: other vendors' sockets stay out of its reach.
"""

from __future__ import annotations

import os
import re

from pcitopo.errors import ConfigError

PLUGIN_ROOT = "/var/run/kubevirt-plugin"
DEFAULT_PLUGIN = "pcitopo"
DOMAIN_SOCKET_NAME = "domain.sock"
NODE_HOOK_SOCKET = "/var/run/kubevirt/plugins/pcitopo/node.sock"  # a folder of its own: the DaemonSet mounts only that
MAX_SOCKET_PATH = 108  # sizeof(sockaddr_un.sun_path) on Linux
# A Plugin's name is a Kubernetes object name (DNS subdomain); it is also the folder name.
_PLUGIN_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def domain_socket(plugin: str) -> str:
    """The domain hook's socket for a Plugin named ``plugin`` (what its CR's socketPath says)."""
    check_plugin_name(plugin)
    return f"{PLUGIN_ROOT}/{plugin}/{DOMAIN_SOCKET_NAME}"


def check_plugin_name(plugin: str) -> None:
    if not _PLUGIN_NAME.fullmatch(plugin or ""):
        raise ConfigError(f"--plugin {plugin[:60]!r}: not a Plugin name (lower-case letters, digits, '-' and '.')")


def check_domain_socket(path: str, plugin: str) -> None:
    """Raise ConfigError, in one line, unless virt-launcher v1.9 would dial ``path`` for the
    Plugin ``plugin``."""
    check_plugin_name(plugin)
    folder = f"{PLUGIN_ROOT}/{plugin}/"
    why = None
    if os.path.normpath(path) != path or not path.startswith("/"):
        why = "is not a clean absolute path"
    elif not path.startswith(folder) or "/" in path[len(folder):]:
        why = f"is not directly in {folder}"
    elif not path.endswith(".sock"):
        why = "does not end in .sock"
    elif len(path.encode()) > MAX_SOCKET_PATH:
        why = f"is longer than {MAX_SOCKET_PATH} bytes"
    elif os.path.islink(path):
        why = "is a symlink"
    if why:
        raise ConfigError(f"plugin socket {path} {why}: virt-launcher (KubeVirt v1.9) only dials sockets "
                          f"under {folder}, e.g. {domain_socket(plugin)}")


def hand_to(path: str, uid: int, gid: int) -> None:
    """Give the socket we just bound to ``uid``:``gid`` (virt-launcher's compute container)
    without following a symlink: the folder is shared with other containers, so ``path`` is
    checked to be a socket and chowned itself (lchown), never what a link there points to."""
    import stat

    st = os.lstat(path)
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"{path} is no longer our socket (now {'a symlink' if stat.S_ISLNK(st.st_mode) else 'not a socket'}); "
                          f"refusing to change its owner")
    os.chown(path, uid, gid, follow_symlinks=False)
