"""Shared helpers: build a host from a few lines of `.topo` text, in memory."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
# issue 11: the host CPU's address width comes from /proc/cpuinfo; tests (and the doors they run
# as subprocesses) read a fixed one, a 46-bit Sapphire Rapids, so results do not depend on this machine.
os.environ.setdefault("PCITOPO_CPUINFO", str(Path(__file__).resolve().parent / "data" / "cpuinfo-46bits"))

from topology.model import Topology  # noqa: E402
from topology.sysfs import SysfsReader  # noqa: E402
from topology.synth import build_tree, parse_topo  # noqa: E402


def host_from_topo(text: str, name: str = "test-host") -> Topology:
    return Topology(SysfsReader(build_tree(parse_topo(textwrap.dedent(text), name))))


@pytest.fixture
def topo():
    return host_from_topo
