"""Shared helpers: build a host from a few lines of `.topo` text, in memory."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from topology.model import Topology  # noqa: E402
from topology.sysfs import SysfsReader  # noqa: E402
from topology.synth import build_tree, parse_topo  # noqa: E402


def host_from_topo(text: str, name: str = "test-host") -> Topology:
    return Topology(SysfsReader(build_tree(parse_topo(textwrap.dedent(text), name))))


@pytest.fixture
def topo():
    return host_from_topo
