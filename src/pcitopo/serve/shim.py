"""``onDefineDomain``: the executable KubeVirt's sidecar-shim image runs once per call.

    onDefineDomain --vmi <VMI JSON> --domain <domain XML>

KubeVirt's shim (cmd/sidecars/sidecar_shim.go) serves the gRPC API itself and, for each
``OnDefineDomain``, executes the first ``onDefineDomain`` on ``$PATH`` with exactly these two
arguments; the new domain XML is our stdout, and a non-zero exit fails the VM start. So:
- stdout carries only the XML (raw bytes, never empty);
- a failure is exit 2 (our typed errors) or 3 (a bug) with one line on stderr;
- the sysfs root comes from ``$PCITOPO_SYSFS`` (default ``/sys``), since the shim passes
  nothing else; ``--sysfs`` is accepted for people running it by hand; the doctor's report
  (for ``doctor: require``'s ACS and ATS checks) from ``$PCITOPO_DOCTOR_REPORT`` (default
  ``/var/run/pcitopo/doctor.json``).
The shim collects our stderr but does not show it on failure (its log says only "exit status
2"); use the pcitopo image (``pcitopo serve``) to get our reason into virt-launcher's log.

Argument values are taken verbatim (``--vmi`` JSON or ``--domain`` XML may start with any
character), and turned back into the exact bytes the shim passed (``os.fsencode``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence

from pcitopo.errors import ConfigError
from pcitopo.program import EXIT_OK, run_program

PROG = "onDefineDomain"
USAGE = f"usage: {PROG} --vmi JSON --domain XML [--sysfs PATH]"


def parse_args(argv: Sequence[str]) -> dict[str, str] | None:
    """``--name VALUE`` or ``--name=VALUE`` for vmi, domain, sysfs; every value verbatim.
    None for ``-h``/``--help`` in an option's place."""
    known = ("vmi", "domain", "sysfs")
    out: dict[str, str] = {}
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-h", "--help"):
            return None
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg[:40]!r} ({USAGE})")
        name, eq, value = arg[2:].partition("=")
        if name not in known:
            raise ConfigError(f"unknown option --{name[:40]} ({USAGE})")
        if not eq:
            if i + 1 >= len(args):
                raise ConfigError(f"--{name} needs a value ({USAGE})")
            i += 1
            value = args[i]
        if name in out:
            raise ConfigError(f"--{name} given twice")
        out[name] = value
        i += 1
    if "domain" not in out:
        raise ConfigError(f"--domain is required ({USAGE})")
    return out


class _Once:
    """Call ``fn`` once and keep the result (the rewrite and the fabric check share one host)."""

    def __init__(self, fn):
        self._fn, self._value = fn, None

    def __call__(self):
        if self._value is None:
            self._value = self._fn()
        return self._value


def run(argv: Sequence[str]) -> int:
    from pcitopo.host.sources import default_sysfs
    from pcitopo.host.sysfs import open_host
    from pcitopo.serve.core import handle_define_domain

    t0 = time.perf_counter()
    args = parse_args(argv)
    if args is None:
        print(USAGE)
        return EXIT_OK
    sysfs = args.get("sysfs") or default_sysfs()
    domain = os.fsencode(args["domain"])
    vmi = os.fsencode(args["vmi"]) if "vmi" in args else None
    host = _Once(lambda: open_host(sysfs))
    fabric = None
    if os.environ.get("PCITOPO_FABRIC"):  # the shim has no flags of ours: the environment says it
        from pcitopo.paths.fabric import FabricFile

        fabric = FabricFile(os.environ["PCITOPO_FABRIC"], os.environ.get("PCITOPO_MODULE_MAP") or None, host)
    from pcitopo.serve.plugin.doctorfile import DEFAULT_DOCTOR_REPORT, DoctorFile

    doctor_file = DoctorFile(os.environ.get("PCITOPO_DOCTOR_REPORT") or DEFAULT_DOCTOR_REPORT)
    outcome = handle_define_domain(domain, vmi, host, fabric, doctor_file)
    out = sys.stdout.buffer
    out.write(outcome.xml)
    out.flush()
    record = {
        "event": "OnDefineDomain", "door": "shim", "vmi": outcome.vmi.ref, "outcome": outcome.outcome,
        "reason": outcome.reason, "duration_ms": round((time.perf_counter() - t0) * 1000, 2), **outcome.summary,
    }
    print(json.dumps({k: v for k, v in record.items() if v is not None}, separators=(",", ":")), file=sys.stderr)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return run_program(PROG, lambda: run(args), with_kind=True, output_is_result=True)


if __name__ == "__main__":
    sys.exit(main())
