"""What a domain prediction is asked with, and its answer: the manifest read as the
VM or VMI it is (src/pcitopo/kubevirt/manifest.py's checks), the cluster dump (src/pcitopo/kubevirt/cluster.py), the release
(``--kubevirt``, the dump's, else v1.9.0), and what both commands ask (``pcitopo domain``;
``xmlfix --vmi`` without a domain argument) as a :class:`PredictionRequest`: :func:`predicted_domain`.
Every assumption is a line of :attr:`Predicted.notes`; bad input is one line (ConfigError).
"""

from __future__ import annotations

from dataclasses import dataclass

from pcitopo.errors import ConfigError
from pcitopo.kubevirt.hostdevices import NameVerdict
from pcitopo.kubevirt.kubelet.settings import KubeletRequest


@dataclass(frozen=True)
class PredictionRequest:
    """What a prediction is asked with besides the manifest and the node (src/pcitopo/cli/prediction.py
    reads it from ``pcitopo domain``'s or ``xmlfix --vmi``'s options); None or empty: not given."""

    kubevirt: str | None = None  # --kubevirt: the release whose virt-launcher builds the domain
    assume_release: str | None = None  # --assume-release: judge it as this read release
    cluster: tuple[str, ...] = ()  # --cluster: the dump's paths (- for stdin)
    devices: str | None = None  # --devices: BDF,... as kubelet hands them
    kubelet: KubeletRequest = KubeletRequest()


@dataclass(frozen=True)
class Predicted:
    xml: bytes
    version: str
    notes: tuple[str, ...]
    vmi: dict  # the VMI the domain is for (instance type applied), for the hook's later calls
    release: object  # pcitopo.kubevirt.launcher.release_groups.Release
    # the VMI's resource names on the dump (src/pcitopo/kubevirt/hostdevices.py judge_names); with a name
    # the cluster lacks, no domain (xml is empty): no pod is made for it
    names: NameVerdict = NameVerdict()
    # what the node's source cannot say about the picked functions (a copy without driver links)
    gaps: tuple[str, ...] = ()
    sizing: str | None = None  # when a device's node gets no guest cell: the vCPU count that gives it one

    @property
    def unknowns(self) -> tuple[str, ...]:
        """What the domain rests on that the inputs do not say: ``xmlfix --check`` and ``pcitopo
        domain`` say unknown (exit 4) for it."""
        return tuple(self.names.unknown) + self.gaps


def _release(args: PredictionRequest, dump):
    """The release group, its name, and where it came from; a release pcitopo did not read raises
    :class:`~pcitopo.kubevirt.releases.ReleaseUnknown` unless ``--assume-release`` names one."""
    from pcitopo.kubevirt.launcher.release_groups import DEFAULT_VERSION, release_of, version_text
    from pcitopo.kubevirt.releases import check_kubevirt, judged_as

    cr = dump.kubevirt if dump is not None else None
    assume = args.assume_release
    if args.kubevirt:
        version, why = check_kubevirt(args.kubevirt), "--kubevirt"
    elif cr is not None and cr.version:
        version, why = cr.version, "the dump's KubeVirt CR"
    elif assume:
        version, why = None, "--assume-release"
    else:
        version, why = DEFAULT_VERSION, "assumed: give --kubevirt or --cluster"
    name, said = judged_as(version, assume)
    return release_of(name), version_text(name), said or why


def predicted_domain(args: PredictionRequest, manifest: bytes, name: str, host) -> Predicted:
    """The prediction for the ``--vmi`` file ``name`` (its bytes: ``manifest``, read once by the
    command, standard input included) on ``host`` as ``args`` asks."""
    from pcitopo.kubevirt.hostdevices import driver_gaps, names_on
    from pcitopo.kubevirt.kubelet.settings import resolve
    from pcitopo.kubevirt.launcher.allocation import parse_devices
    from pcitopo.kubevirt.launcher.converter import UPSTREAM_MACHINE
    from pcitopo.kubevirt.launcher.cpus import CpuPolicy
    from pcitopo.kubevirt.launcher.dumped import expand
    from pcitopo.kubevirt.launcher.first_domain import Inputs, predict

    dump = None
    if args.cluster:
        from pcitopo.kubevirt.cluster import read_dump

        dump = read_dump(list(args.cluster))
    doc = _manifest(manifest, name)
    from pcitopo.kubevirt.manifest import as_vmi

    vmi, notes = expand(doc, as_vmi(doc, name), dump)
    release, version, why = _release(args, dump)
    cr = dump.kubevirt if dump is not None else None
    names = names_on(vmi, dump)
    if names.failed:  # before any function is picked: a name the cluster lacks is not a driver binding
        return Predicted(b"", version, (), vmi, release, names)
    kubelet = resolve(args.kubelet)
    policy = CpuPolicy.DEVICES if kubelet.spread_over_devices else \
        CpuPolicy.DISTRIBUTE if kubelet.settings.distribute else CpuPolicy.PACKED
    model = ((cr.raw.get("spec") or {}).get("configuration") or {}).get("cpuModel") if cr else None
    inputs = Inputs(release=release, version=version, machine=(cr.machine_type if cr and cr.machine_type else UPSTREAM_MACHINE),
                    cpu_model=model or "host-model",
                    devices=tuple(parse_devices(args.devices)), policy=policy, kubelet=kubelet.settings,
                    permitted=cr.permitted if cr else None, dump=dump)
    try:
        p = predict(host, vmi, inputs)
    except ConfigError as e:
        if names.unknown:  # the name itself may not exist: say that before any driver binding
            raise ConfigError(f"{names.unknown[0]}; and on this node: {e.reason}") from None
        raise
    head = [f"KubeVirt {version} ({why}), machine {inputs.machine}"]
    if kubelet.assumed:
        head.append(kubelet.assumed)
    gaps = driver_gaps(host, [h.source for h in p.hostdevs])
    return Predicted(p.xml, version, tuple(head + notes + list(p.notes)), vmi, release, names, gaps, p.sizing)


def _manifest(data: bytes, name: str) -> dict:
    """The manifest as an object: the one VM or VMI (YAML or JSON; of several documents the one
    VM or VMI), after the checks ``xmlfix --vmi`` makes (src/pcitopo/kubevirt/manifest.py)."""
    from pcitopo.kubevirt.manifest import manifest_document, vmi_as_json

    vmi_as_json(data, name)  # kinds, annotations, labels: the same messages as --vmi
    return manifest_document(data, name)


