"""The limits of a PCI address (PCI Local Bus spec; libvirt's ``<address type='pci'>`` ranges).

They bound what the model parses (a BDF's device number), what the domain reader accepts and
what the planner budgets: the one copy every room reads, so none of them imports the planner.
"""

from __future__ import annotations

# A PCI domain has 256 bus numbers (8 bits), expander buses included: a pxb-pcie's busNr is a
# bus number of the same domain as pcie-root.
BUS_COUNT = 256
MAX_BUS = BUS_COUNT - 1
# Devices (slots) per bus: 5 bits, 0x00-0x1f.
SLOTS_PER_BUS = 32
MAX_SLOT = SLOTS_PER_BUS - 1
# Functions per slot: 3 bits, 0-7 (function 0 carries multifunction='on').
MAX_FUNCTIONS_PER_SLOT = 8
MAX_FUNCTION = MAX_FUNCTIONS_PER_SLOT - 1
# PCI domain (segment) numbers are 16 bits.
MAX_PCI_DOMAIN = 0xFFFF
# libvirt's pci controller index names a bus: 0 (pcie-root) to 255.
MAX_CONTROLLER_INDEX = MAX_BUS


def address_in_range(domain: int, bus: int, slot: int, function: int) -> bool:
    """Whether (domain, bus, slot, function) is a PCI address at all."""
    return 0 <= domain <= MAX_PCI_DOMAIN and 0 <= bus <= MAX_BUS and 0 <= slot <= MAX_SLOT and 0 <= function <= MAX_FUNCTION
