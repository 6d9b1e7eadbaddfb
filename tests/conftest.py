"""The ``topo`` fixture: build a host from a few lines of `.topo` text, in memory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testkit.synth import host_from_topo

# issue 11: the host CPU's address width comes from /proc/cpuinfo; tests (and the doors they run
# as subprocesses) read a fixed one, a 46-bit Sapphire Rapids, so results do not depend on this machine.
os.environ.setdefault("PCITOPO_CPUINFO", str(Path(__file__).resolve().parent / "data" / "cpuinfo-46bits"))


@pytest.fixture
def topo():
    return host_from_topo
