"""Boot tables shown at the end of an e2e module, with or without ``-s``."""

from __future__ import annotations

import pytest


def show_past_capture(config: pytest.Config, lines: list[str]) -> None:
    """Write ``lines`` straight to the terminal, past pytest's output capture: a boot table
    (times, MMIO results) is worth seeing on every run, not only under ``-s``."""
    pm = config.pluginmanager
    tr, capman = pm.getplugin("terminalreporter"), pm.getplugin("capturemanager")
    if tr is None or capman is None:  # pragma: no cover
        print("\n".join(lines))
        return
    with capman.global_and_fixture_disabled():
        tr.write_line("")
        for line in lines:
            tr.write_line(line)
