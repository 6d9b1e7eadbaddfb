"""One VM on its cluster, judged the way ``pcitopo preflight`` judges every VM of a dump: the
KubeVirt release (src/pcitopo/kubevirt/starts.py), the target's Sidecar policies (src/pcitopo/kubevirt/sidecar_policy.py
through src/pcitopo/kubevirt/cluster_verdict.py), and its resource names against permittedHostDevices and the
nodes (src/pcitopo/kubevirt/hostdevices.py). ``xmlfix --check --vmi`` and ``pcitopo domain --cluster`` ask
here, so the dry run and preflight cannot disagree about a VM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pcitopo.errors import ConfigError
from pcitopo.kubevirt.hostdevices import NameVerdict


@dataclass(frozen=True)
class VmJudgement:
    """What keeps the VM from starting as pcitopo wants it, as (reason code, sentence) pairs; what
    cannot be told; and the verdict line's phrase for the release judged."""

    failures: tuple[tuple[str, str], ...] = ()
    unknowns: tuple[str, ...] = ()
    on: str | None = None


@dataclass(frozen=True)
class VmQuestion:
    """Where and how to judge: the dump (``--cluster``), a release (``--kubevirt``,
    ``--assume-release``), the door asked for, the pinned images (``--image``) and the target
    whose policies apply (``--target``)."""

    dump_paths: tuple[str, ...] = ()
    release: str | None = None
    assume: str | None = None
    door: str | None = None
    images: tuple[str, ...] = ()
    target: str | None = None
    vmi_name: str = "VMI"


def policy_of(vmi: Mapping[str, Any], q: VmQuestion, dump=None):
    """The Sidecar policy's refusal of ``vmi`` (None: admitted or not judged; not certain: it
    hinges on what the dump lacks) and the pcitopo images the admin pinned (``--image``, else the
    dump's params)."""
    from pcitopo.kubevirt.admitted import in_dump, judged
    from pcitopo.kubevirt.cluster_verdict import vmi_policy_refusal
    from pcitopo.kubevirt.targets import TARGETS, target

    if q.target is not None and q.target not in [t.name for t in TARGETS]:
        raise ConfigError(f"--target {q.target!r}: give one of {', '.join(t.name for t in TARGETS)}")
    refusal = vmi_policy_refusal(dict(vmi), dump, target(q.target) if q.target else None, q.images)
    pinned = judged(in_dump(dump) if dump is not None else None, q.images).pcitopo
    return refusal, pinned


def judge_vm(vmi: Mapping[str, Any], q: VmQuestion, domain_xml: bytes = b"",
             names: NameVerdict | None = None) -> VmJudgement:
    """``names``: the resource names as a prediction already judged them (else judged here on the
    dump, when there is one)."""
    from pcitopo.kubevirt.cluster import read_dump
    from pcitopo.kubevirt.hostdevices import names_on
    from pcitopo.kubevirt.manifest import as_vmi
    from pcitopo.kubevirt.starts import release_check

    dump = read_dump(list(q.dump_paths)) if q.dump_paths else None
    policy, pinned = policy_of(vmi, q, dump)
    judged = release_check(dict(vmi), q.door, list(q.dump_paths) or None, q.release, domain_xml, q.assume, pinned)
    failures = [("kubevirt-release", line) for line in judged.lines]
    if policy is not None and policy.certain:
        failures.append(("policy", f"policy: {policy.why}" + (f" (to admit it, vetted: {policy.admit})" if policy.admit else "")))
    if names is None:
        names = names_on(as_vmi(dict(vmi), q.vmi_name), dump) if dump is not None else NameVerdict()
    failures += [("device-name", line) for line in names.failed]
    unknowns = list(names.unknown)
    if judged.unknown:  # a release nobody read: neither ok nor failed
        unknowns.append(f"kubevirt: {judged.unknown}")
    if policy is not None and not policy.certain:
        unknowns.append(f"policy: {policy.why}")
    return VmJudgement(tuple(failures), tuple(unknowns), judged.on)
