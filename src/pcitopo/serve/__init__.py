"""The servers KubeVirt calls: the hook sidecar's gRPC server, the Plugin's and the node hook's,
the shim virt-launcher runs, the hook options and the wire bytes; one handler (core) behind them."""
