"""pcitopo's library: host PCIe topology, path classification, mirror planning, domain rewrite."""
