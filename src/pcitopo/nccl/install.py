"""``install-nccl-topo``, in the guest: copy the NCCL topology file the hook passed through
fw_cfg to where NCCL looks for it, on every boot (the guest's PCI addresses are the hook's
prediction for this boot; ``/run`` is a tmpfs, so nothing stale survives a reboot).

Standard library only, Python 3.8 or newer (it runs in guests). Exit status: 0 installed;
1 nothing offered (no fw_cfg entry: the VM was started without ``nccl-topo: fwcfg``, or the
guest kernel lacks ``qemu_fw_cfg``); 2 the blob is not a file NCCL would load (nothing written).
"""

import os
import subprocess
import sys
from typing import List, Optional

from pcitopo.errors import OutputError
from pcitopo.nccl.topoxml import DEFAULT_TOPO_FILE, FWCFG_DIR, FWCFG_NAME, NcclXmlError, decode_offered, fwcfg_raw_path, install

EXIT_OK, EXIT_NONE, EXIT_BAD = 0, 1, 2


def _load_module() -> None:
    """Debian-style kernels build the fw_cfg sysfs driver as a module; load it once."""
    if os.path.isdir(FWCFG_DIR):
        return
    try:
        subprocess.run(["modprobe", "qemu_fw_cfg"], check=False, timeout=30,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        pass


def install_offered(source: str, dest: str) -> List[str]:
    """Install the blob at ``source`` to ``dest``; raises OSError/NcclXmlError."""
    with open(source, "rb") as fh:
        data = decode_offered(fh.read())
    install(data, dest)
    return [f"installed {dest} ({len(data)} bytes) from fw_cfg {FWCFG_NAME}"]


def install_from(source: Optional[str], dest: str = DEFAULT_TOPO_FILE, prog: str = "install-nccl-topo") -> int:
    """The command's work once its options are read (``pcitopo guest install-nccl-topo``'s parser
    is the guest tool's): the blob at ``source`` (None: the fw_cfg entry, its module loaded) to
    ``dest``, one line on stderr per outcome; the exit status."""
    if source is None:
        _load_module()
        source = fwcfg_raw_path()
    if not os.path.exists(source):
        print(f"{prog}: no NCCL topology offered by the host ({source} not found: VM started without the "
              "pcitopo hook's nccl-topo, or no qemu_fw_cfg module)", file=sys.stderr)
        return EXIT_NONE
    try:
        for line in install_offered(source, dest):
            print(f"{prog}: {line}", file=sys.stderr)
    except NcclXmlError as e:
        print(f"{prog}: {source}: not installed: {e}", file=sys.stderr)
        return EXIT_BAD
    except OutputError as e:  # the destination (write_atomic's one line)
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_BAD
    except OSError as e:
        print(f"{prog}: {e.filename or source}: {e.strerror or e}", file=sys.stderr)
        return EXIT_BAD
    return EXIT_OK
