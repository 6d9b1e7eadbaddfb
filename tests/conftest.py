"""The ``topo`` fixture: build a host from a few lines of `.topo` text, in memory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pcitopo.synth import host_from_topo

# the host CPU's address width comes from /proc/cpuinfo; tests (and the programs they run
# as subprocesses) read a fixed one, a 46-bit Sapphire Rapids, so results do not depend on this machine.
os.environ.setdefault("PCITOPO_CPUINFO", str(Path(__file__).resolve().parent / "data" / "cpuinfo-46bits"))


@pytest.fixture
def topo():
    return host_from_topo


def pytest_collection_modifyitems(config, items):
    """The arm64 image (marker ``image_slow``, about 10 CPU-minutes under qemu-user on a cold
    container store) runs only in the slow tier: ``PCITOPO_E2E_SLOW=1`` (``make test-slow``),
    the same exact switch as the slow boots (testkit/e2e/paths.py, ``slow_tier_on``)."""
    if os.environ.get("PCITOPO_E2E_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="arm64 image under qemu-user: run with PCITOPO_E2E_SLOW=1 (make test-slow)")
    for item in items:
        if item.get_closest_marker("image_slow"):
            item.add_marker(skip)
