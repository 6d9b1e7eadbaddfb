"""End-to-end tier: boot rewritten domains under QEMU/TCG with a private
libvirtd and read the guest's PCI tree back. See README.md here."""
