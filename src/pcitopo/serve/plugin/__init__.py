"""pcitopo as a KubeVirt Plugin (VEP 190, KubeVirt v1.9 and later): where its sockets live
(:mod:`.sockets`) and what the node hook asks of a node (:mod:`.nodehook`). The domain hook
itself is the same rewrite as the hook sidecar's (``pcitopo.serve.hooks.Hooks.mutate_domain``)."""
