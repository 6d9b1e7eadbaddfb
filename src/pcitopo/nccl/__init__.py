"""NCCL's view of a machine, read from NCCL's source: its PCI tree, its bandwidth prices, the
topology file it reads (NCCL_TOPO_FILE) and its install in a guest."""
