"""kubelet's CPU placement for a Guaranteed pod, modelled from kubernetes/kubernetes at v1.33
(``pkg/kubelet/cm/cpumanager``, ``pkg/kubelet/cm/topologymanager``; docs/SOURCES.md "kubelet's
CPU allocation"): :mod:`.cputopo` the CPU topology kubelet sees, :mod:`.assignment` its
``cpu_assignment.go``, :mod:`.topologymanager` the hints and their merge, :mod:`.static` the
static policy's reservation and ``allocateCPUs``.
"""
