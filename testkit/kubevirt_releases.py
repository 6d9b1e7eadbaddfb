"""KubeVirt's re-parse between hook calls, per release: the product's model
(:mod:`pcitopo.kubevirt.launcher.reparse`, :mod:`pcitopo.kubevirt.launcher.release_groups`), named here
for the tests that import it from the test kit."""

from __future__ import annotations

from pcitopo.kubevirt.launcher.release_groups import OVMF_DIR, RELEASES, Release  # noqa: F401
from pcitopo.kubevirt.launcher.reparse import reparse  # noqa: F401
from pcitopo.libvirt.domain import QEMU_NS  # noqa: F401
