"""``pcitopo golden``: golden files for a team's own nodes, and a check that says whether a
difference matters to the guest.

    pcitopo golden make NODE [--vmi VM.yaml ...] [-o GOLDEN_DIR]
    pcitopo golden check NODE GOLDEN_DIR [--update]

The files (:mod:`.make`), the sorting of differences (:mod:`.compare`, :mod:`.placement`);
this module parses the arguments and prints. docs/CI.md is the recipe.
"""

from __future__ import annotations

import argparse
import os
import sys

from pcitopo.errors import ConfigError

EXIT_OK, EXIT_GUEST_VISIBLE = 0, 1


def add_golden_parser(sub) -> None:
    g = sub.add_parser("golden", help="golden files for your own nodes (make), and a check that sorts differences by "
                       "whether the guest sees them (check); docs/CI.md",
                       description="Hermetic: no PCITOPO_* variable, no current directory and no /proc/cpuinfo of this "
                       "machine changes the result. Exit 0: nothing the guest sees differs; 1: a guest-visible difference; "
                       "2: bad input.")
    gs = g.add_subparsers(dest="golden_command", required=True, parser_class=type(g))
    m = gs.add_parser("make", help="write the goldens of one node")
    m.add_argument("node", metavar="NODE", help="the node: a capture .tar.gz (pcitopo capture, capture --from-topo), "
                   "a sysfs tree or a fixture directory")
    m.add_argument("--vmi", metavar="VM.yaml", action="append", help="a VM or VMI manifest (repeatable; its metadata.name "
                   "names its folder); default: one VM with every GPU and NIC of the node")
    m.add_argument("-o", "--output", metavar="GOLDEN_DIR", help="where to write them (default: golden/NODE-NAME)")
    c = gs.add_parser("check", help="compare the goldens with what this pcitopo makes of the node")
    c.add_argument("node", metavar="NODE", help="the node the goldens were made for")
    c.add_argument("golden", metavar="GOLDEN_DIR", help="the directory golden make wrote")
    c.add_argument("--update", action="store_true", help="after the report, rewrite the goldens (same VMs) and exit 0")


def cmd_golden(args: argparse.Namespace) -> int:
    from pcitopo.cli.golden.make import HERMETIC

    print(f"pcitopo golden {args.golden_command}: {HERMETIC}", file=sys.stderr)
    return _make(args) if args.golden_command == "make" else _check(args)


def _read(path: str) -> bytes:
    from pcitopo.host.files import read_bounded
    from pcitopo.program import MAX_VMI_BYTES

    return read_bounded(path, MAX_VMI_BYTES, "file")


def _make(args: argparse.Namespace) -> int:
    from pcitopo.cli.golden.make import DEFAULT_VM, all_outputs, default_vm, read_node, vm_name, write_golden

    node = read_node(args.node)
    vms: dict[str, bytes] = {}
    for path in args.vmi or ():
        data = _read(path)
        name = vm_name(data, path)
        if name in vms:
            raise ConfigError(f"{path}: a second VM named {name!r} (the name is its folder in the golden directory)")
        vms[name] = data
    if not vms:
        vms[DEFAULT_VM] = default_vm(node.host)
    out = args.output or os.path.join("golden", node.label.split("/")[0])
    files = all_outputs(node, vms, bool(args.vmi))
    write_golden(out, files)
    print(f"pcitopo golden make: wrote {len(files)} files to {out} for node {node.label} (sha256 {node.digest[:12]}), "
          f"VM(s) {', '.join(vms)}", file=sys.stderr)
    return EXIT_OK


def _golden_files(directory: str, update: bool = False) -> tuple[dict, dict[str, dict[str, bytes]]]:
    """golden.json and each VM's golden files; a missing one is bad input, except under
    ``update`` (it reads as empty, a guest-visible difference, then is written)."""
    from pcitopo.cli.golden.compare import _load
    from pcitopo.cli.golden.make import FILES, GOLDEN_FORMAT, GOLDEN_JSON, VM_FILE

    record = _load(_read(os.path.join(directory, GOLDEN_JSON)), os.path.join(directory, GOLDEN_JSON))
    if record.get("golden_format") != GOLDEN_FORMAT:
        raise ConfigError(f"{os.path.join(directory, GOLDEN_JSON)}: golden_format {record.get('golden_format')!r}, this pcitopo "
                          f"reads {GOLDEN_FORMAT} (make the goldens again with pcitopo golden make)")
    vms: dict[str, dict[str, bytes]] = {}
    for vm in record.get("vms") or ():
        name = vm.get("name") if isinstance(vm, dict) else None
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise ConfigError(f"{directory}/{GOLDEN_JSON}: a VM without a usable name")
        files = {}
        for fname in (VM_FILE, *FILES):
            path = os.path.join(directory, name, fname)
            # no NCCL file: no GPU or NIC placed
            if not os.path.isfile(path) and fname != "nccl-topo.xml" and (fname == VM_FILE or not update):
                raise ConfigError(f"{path}: missing (pcitopo golden make writes it; --update cannot, the VM is in it)"
                                  if fname == VM_FILE else f"{path}: missing (pcitopo golden check --update writes it)")
            files[fname] = _read(path) if os.path.isfile(path) else b""
        vms[name] = files
    return record, vms


def _check(args: argparse.Namespace) -> int:
    from pcitopo import __version__
    from pcitopo.cli.golden.compare import Differences, compare_vm
    from pcitopo.cli.golden.make import VM_FILE, all_outputs, read_node, write_golden

    record, golden = _golden_files(args.golden, args.update)
    node = read_node(args.node)
    fresh = all_outputs(node, {name: files[VM_FILE] for name, files in golden.items()},
                        any(v.get("given") for v in record.get("vms") or ()))
    diffs = Differences()
    for name, files in golden.items():
        mine = {f.split("/", 1)[1]: data for f, data in fresh.items() if f.startswith(f"{name}/")}
        diffs.add(name, compare_vm(files, mine))
    was = record.get("node") or {}
    same = "unchanged" if was.get("sha256") == node.digest else f"changed: sha256 {str(was.get('sha256'))[:12]} -> {node.digest[:12]}"
    print(f"golden: made by pcitopo {record.get('pcitopo')} for node {was.get('name')}; checked with pcitopo {__version__}; "
          f"node {node.label} {same}")
    print(f"guest-visible: {len(diffs.guest)}")
    print("".join(f"  {line}\n" for line in diffs.guest), end="")
    print(f"layout only: {len(diffs.layout)}")
    print("".join(f"  {line}\n" for line in diffs.layout), end="")
    print(f"text only: {diffs.text} difference(s) in wording, notes or keys outside the contract (not listed)")
    if args.update:
        write_golden(args.golden, fresh)
        print(f"updated {args.golden} ({len(fresh)} files)")
        return EXIT_OK
    if diffs.guest:
        print(f"check: failed: {len(diffs.guest)} difference(s) the guest would see")
        return EXIT_GUEST_VISIBLE
    print("check: ok: nothing the guest sees differs" + (" (layout or text only, above)" if diffs.layout or diffs.text else ""))
    return EXIT_OK
