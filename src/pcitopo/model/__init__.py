"""The model every room shares: the PCI tree, PCI address limits, BARs, the CPU's address width, device labels."""
