"""Issue 26 finding 12, "Smaller points, each with a test": the ones with no better home (the
pcieRoot rule is in test_pairs.py). Each test is named ``test_f12_<what>``."""

from __future__ import annotations

import re
import shlex

from testkit import REPO as ROOT

DOCS = ROOT / "docs"

# virtctl scp's options that take a value (pkg/virtctl/ssh AddCommandlineArgs, and kubectl's -n)
_VIRTCTL_VALUED = {"-n", "--namespace", "-i", "--identity-file", "-p", "--port", "-l", "--username",
                   "-t", "--local-ssh-opts", "--known-hosts", "--kubeconfig", "--context"}


def _scp_positionals(line: str) -> list[str]:
    args = shlex.split(line)[2:]  # after "virtctl scp"
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a.startswith("-"):
            skip = a in _VIRTCTL_VALUED  # "--namespace=ml" carries its value
        else:
            out.append(a)
    return out


def test_f12_virtctl_scp_lines_have_a_source_and_a_destination():
    """`virtctl scp` takes exactly two positional arguments (kubevirt/kubevirt
    pkg/virtctl/scp/scp.go: templates.ExactArgs("scp", 2)); GUEST.md gave it three."""
    docs = [ROOT / "README.md", *DOCS.glob("*.md")]
    found = []
    for doc in docs:
        for line in doc.read_text().splitlines():
            if re.match(r"\s*(\$ )?virtctl scp ", line):
                found.append((doc.name, line))
                args = _scp_positionals(line.strip().removeprefix("$ "))
                assert len(args) == 2, (doc.name, line, args)
                assert sum(":" in a for a in args) == 1, (doc.name, line)  # one side is the VM
    assert len(found) >= 2, found  # the guest tool and the prediction, one command each
