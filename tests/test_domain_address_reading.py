"""Reading guest and source addresses: the parsed spellings are shared between calls (the hook
reads about 180 addresses per call), and that sharing never hides a bad address nor grows
without bound."""

from __future__ import annotations

import pytest
from lxml import etree

from pcitopo.errors import DomainError
from pcitopo.libvirt import domain


def _hostdev(bus: str) -> etree._Element:
    return etree.fromstring(f"<hostdev><address type='pci' domain='0x0000' bus='{bus}' slot='0x00' function='0x0'/></hostdev>")


def test_a_bad_spelling_is_named_every_time_it_is_read():
    for _ in range(3):
        with pytest.raises(DomainError, match="address bus='0xzz' is not a number"):
            domain.read_guest_address(_hostdev("0xzz"))


def test_the_same_spelling_reads_the_same_address_and_hex_and_decimal_agree():
    assert domain.read_guest_address(_hostdev("0x1a")) == domain.read_guest_address(_hostdev("26")) == (26, 0, 0, 0)
    assert domain.read_guest_address(_hostdev("0x1a")) == (26, 0, 0, 0)


def test_the_shared_spellings_stay_bounded(monkeypatch):
    monkeypatch.setattr(domain, "_PARSED", {})
    for bus in range(domain._PARSED_MAX + 50):
        domain.read_guest_address(_hostdev(str(bus % 256)) if bus < 256 else
                                  etree.fromstring(f"<h><address type='pci' bus='0x01' slot='{bus % 32}' "
                                                   f"function='{bus % 8}' domain='{bus}'/></h>"))
    assert len(domain._PARSED) <= domain._PARSED_MAX
