"""pcitopo's library: host PCIe topology, path classification, mirror planning, domain rewrite."""

# The one place the version is written: pyproject.toml reads it (dynamic), every door prints it.
__version__ = "0.1.0"
