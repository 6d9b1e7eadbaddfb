"""What KubeVirt does: its releases and doors, how it reads VMs, VMIs and cluster dumps, and the
domain its virt-launcher builds. The second of pcitopo's three rooms: ``topology`` says what the
host is, ``kubevirt`` what KubeVirt does, ``sidecar`` how pcitopo is called."""
