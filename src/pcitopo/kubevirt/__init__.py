"""What KubeVirt does: its releases and doors, how it reads VMs, VMIs and cluster dumps, and the
domain its virt-launcher builds. Above the host and guest rooms (what the host is, what the guest
gets), below :mod:`pcitopo.serve` and :mod:`pcitopo.cli` (how pcitopo is called)."""
