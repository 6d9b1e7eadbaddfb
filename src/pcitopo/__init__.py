"""pcitopo: a host's PCIe topology read from sysfs, mirrored into a libvirt guest (plan, rewrite,
checks), with the commands and the servers KubeVirt calls."""

import sys

# The one place the version is written: pyproject.toml reads it (dynamic), every program prints it.
__version__ = "0.2.0"

# The number of the JSON outputs' contract, carried with the version as "schema" by every
# --json document (stamped below): bumped whenever a key is added, removed, renamed or changes
# type or meaning (CHANGELOG.md, "Version policy"), so a reader can refuse a document it does not know.
SCHEMA = 1


def stamped(doc: dict) -> dict:
    """A JSON output with the pcitopo version that wrote it and its schema number first."""
    return {"pcitopo": __version__, "schema": SCHEMA, **doc}

# dataclass(slots=True) needs Python 3.10; the guest tool (src/pcitopo/cli/guesttool.py) runs the reader,
# the classifier and verify on any guest Python from 3.8, where those classes go without slots.
SLOTS = {"slots": True} if sys.version_info >= (3, 10) else {}
