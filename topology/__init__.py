"""pcitopo's library: host PCIe topology, path classification, mirror planning, domain rewrite."""

import sys

# The one place the version is written: pyproject.toml reads it (dynamic), every door prints it.
__version__ = "0.1.0"

# dataclass(slots=True) needs Python 3.10; the guest tool (sidecar/guest.py) runs the reader,
# the classifier and verify on any guest Python from 3.8, where those classes go without slots.
SLOTS = {"slots": True} if sys.version_info >= (3, 10) else {}
