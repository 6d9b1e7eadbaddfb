"""Free hotplug root ports a VM ends with, with and without pcitopo, for every shipped example
(deploy/), through KubeVirt v1.9.0's and main's defines (testkit/kubevirt_define.py) with
libvirt's own placement between them: a private libvirtd (``virsh define`` + ``dumpxml
--inactive``) when libvirt is installed, else the simulation (``--sim``).

    PYTHONPATH=. .venv/bin/python bench/hotplug.py [--sim] [--machine pc-q35-rhel9.6.0]

Prints one markdown table."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from pcitopo.guest.rewrite import rewrite_domain
from pcitopo.kubevirt.launcher.converter import UPSTREAM_MACHINE
from pcitopo.kubevirt.launcher.defines import boot_defines, vmi_interfaces
from pcitopo.kubevirt.launcher.release_groups import Release
from pcitopo.libvirt.define_sim import libvirt_define
from testkit import REPO
from testkit.kubevirt_define import RealLibvirt, free_hotplug_ports, real_libvirt_available
from testkit.kubevirt_vmi import deploy_examples, domain_for_vmi

RELEASES = (Release.V1_9, Release.MAIN)


def measure(define, machine: str = UPSTREAM_MACHINE) -> list[tuple[str, Release, int, int]]:
    """(example, release, free ports with pcitopo, free ports without) per example and release."""
    rows = []
    for name, host, vmi, gpus in deploy_examples(REPO):
        for release in RELEASES:
            first = domain_for_vmi(host, vmi, gpus, release=release, machine=machine)
            hooked = boot_defines(first, lambda x, h=host: rewrite_domain(x, h).xml, release, define, vmi_interfaces(vmi))
            plain = boot_defines(first, lambda x: x, release, define, vmi_interfaces(vmi))
            rows.append((name, release, free_hotplug_ports(hooked.last), free_hotplug_ports(plain.last)))
    return rows


@contextlib.contextmanager
def libvirt_placement(sim: bool):
    """The define function and its label: a private libvirtd's, or the simulation's."""
    if sim or not real_libvirt_available():
        yield libvirt_define, "simulated libvirt (pcitopo/libvirt/define_sim.py)"
        return
    os.environ.setdefault("PCITOPO_CACHE", str(REPO / ".cache" / "e2e"))
    from testkit.e2e.libvirtd import PrivateLibvirtd
    from testkit.stack import DEBIAN12

    with PrivateLibvirtd(stack=DEBIAN12) as daemon:
        yield RealLibvirt(daemon), f"libvirt {daemon.versions().libvirt} (virsh define + dumpxml --inactive)"


def table(rows) -> str:
    lines = ["| example | release | with pcitopo | without | lost |", "|---|---|---|---|---|"]
    for name, release, hooked, plain in rows:
        lines.append(f"| {name} | {release.value} | {hooked} | {plain} | {max(0, plain - hooked)} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sim", action="store_true", help="the simulated libvirt even where libvirt is installed")
    ap.add_argument("--machine", default=UPSTREAM_MACHINE)
    args = ap.parse_args(argv)
    with libvirt_placement(args.sim) as (define, label):
        print(f"free hotplug root ports at the last define ({label}; machine {args.machine})")
        print(table(measure(define, args.machine)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
