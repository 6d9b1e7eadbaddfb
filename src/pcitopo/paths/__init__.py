"""Path classes between devices: the PCIe classifier, the NVLink fabric, partitions, SR-IOV groups."""
