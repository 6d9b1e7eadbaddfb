"""libvirt's additions at define: the product's simulation
(:mod:`pcitopo.libvirt.define_sim`), named here for the tests that import it from the
test kit; :mod:`testkit.kubevirt_define` runs the real libvirt where it is installed."""

from __future__ import annotations

from pcitopo.libvirt.define_sim import libvirt_define  # noqa: F401
from pcitopo.libvirt.marshal import sub as _sub, to_kubevirt_bytes  # noqa: F401
