"""A mixed OnDefineDomain workload on a fixture host, and the answer the library gives to each
call in-process: what ``tests/test_load.py`` and ``bench/load.py`` send over the socket and
compare with."""

from __future__ import annotations

import json

from pcitopo.errors import PcitopoError
from pcitopo.model.tree import Topology
from pcitopo.serve.core import handle_define_domain
from pcitopo.serve.hooks import error_details, status_name
from pcitopo.serve.options import PREFIX

from .kubevirt_sim import DomainSpec, gpus_and_nics, kubevirt_domain, pick
from .strategies import build_domain, fixture_world

Call = tuple[str, bytes, bytes]  # name, domain XML, VMI JSON
Answer = tuple[str, bytes | str]  # ("ok", output XML) or (gRPC status name, details)


def vmi_with(**annotations: str) -> bytes:
    """A minimal VMI carrying ``pcitopo.kubevirt.io/<key>`` annotations."""
    meta = {"name": "load", "namespace": "t", "annotations": {PREFIX + k: v for k, v in annotations.items()}}
    return json.dumps({"metadata": meta}).encode()


def mixed_calls(host_name: str) -> list[Call]:
    """Distinct calls: whole-host and subset domains, guest NUMA or not, a domain pre-placed by
    KubeVirt and defined by libvirt, one the host cannot satisfy, and that one under
    ``on-error: passthrough``, ``mode: off`` and a bad annotation."""
    world = fixture_world(host_name)
    host = world.host
    devs = gpus_and_nics(host)
    nodes = sorted({host.numa_of(host.function(b)) for b in devs})
    unknown = kubevirt_domain(host, DomainSpec("bad", (devs[0],))).replace(
        f'bus="0x{devs[0].bus:02x}"'.encode(), b'bus="0xfe"', 1)
    return [
        ("all", kubevirt_domain(host, DomainSpec("all", tuple(devs))), b""),
        ("first-node", kubevirt_domain(host, DomainSpec("n", tuple(pick(host, devs, nodes[:1])))), b""),
        ("pair", kubevirt_domain(host, DomainSpec("pair", tuple(devs[:2]))), b""),
        ("no-numa", kubevirt_domain(host, DomainSpec("nonuma", tuple(devs), guest_numa=False)), b""),
        ("preplaced", build_domain(world, devs[:6], layout="preplaced-defined"), b""),
        ("unknown-bdf", unknown, b""),
        ("passthrough", unknown, vmi_with(**{"on-error": "passthrough"})),
        ("off", unknown, vmi_with(mode="off")),
        ("bad-annotation", unknown, vmi_with(mode="Mirror")),
    ]


def expected_answer(host: Topology, domain: bytes, vmi: bytes) -> Answer:
    """What the server must answer: the library's output, or the gRPC status it maps the error to."""
    try:
        return ("ok", handle_define_domain(domain, vmi, host).xml)
    except PcitopoError as e:
        return (status_name(e), error_details(e))
