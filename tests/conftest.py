"""The ``topo`` fixture: build a host from a few lines of `.topo` text, in memory."""

from __future__ import annotations

import pytest

from testkit.synth import host_from_topo


@pytest.fixture
def topo():
    return host_from_topo
