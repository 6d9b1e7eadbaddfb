"""The guest-boot (e2e) tier's harness: boot rewritten domains under QEMU/TCG with a private
libvirtd and read the guest's PCI tree back. tests/e2e/README.md describes the pieces."""
