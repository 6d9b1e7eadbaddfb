"""The libvirt domain XML's spellings: controllers, hostdevs, <cpu>/<memory>/<os>, QEMU overrides."""
